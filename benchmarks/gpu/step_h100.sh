#!/usr/bin/env bash
# The whole GRPO step on one lent GPU (issue 16): colocated weight sync against the copy floor, the vLLM
# plugin against raw vLLM, rlcore's step phase by phase against its bound, and verl's step on the same
# workload. Ship the vLLM bundle first (README.md beside this script: .gpu-vllm/c1..c5 -> /tmp/vstage),
# and carry verl's one-chunk bundle (.gpu-verl/c1, benchmarks/gpu/verl_bundle.sh) with the call that unpacks.
#   bash benchmarks/gpu/step_h100.sh [stage ...]      (results and logs under $OUT, default /tmp/out)
# Stages: unpack (vLLM bundle -> /tmp/vsite, pytest and verl's bundle when shipped), setup (the project
# into /tmp/proj), tests (the GPU tests of the ipc transport), sync (vllm_gpu.py sync rows, one process
# per size: 0.5B, 1.5B, 7B), throughput (vllm_gpu.py plugin vs raw, interleaved, with the seeds' cost),
# step (grpo_step_gpu.py: raw vLLM bound run, then rlcore train), verl (verl_grpo_step.py on the same
# model and prompts), compare (both steps into one JSON and table), step-named (one named rlcore run:
# NAME, STEPS, PROFILE, STEP_OVERRIDES; its JSON holds the bound of this machine's step-raw run).
set -uo pipefail
# shellcheck source=benchmarks/gpu/call_lib.sh
source "$(dirname "$0")/call_lib.sh"
# Results stay in /tmp/res while the machine is warm (a call's own $OUT starts empty each call); RES=... to move.
FINAL=${OUT:-}; OUT=${RES:-/tmp/res}; mkdir -p "$OUT"
collect() {  # what comes back: results, logs and tables (models, checkpoints and Ray's logs stay)
  [ -n "$FINAL" ] || return 0
  local final=$FINAL; FINAL=$(mktemp -d)  # gathered first: a call brings back at most 8 files
  (cd "$OUT" && find . -maxdepth 2 -type f \( -name '*.json' -o -name '*.log' -o -name '*.txt' -o -name '*.csv' \) \
     -size -4M ! -path './grpo_step/qwen2*' ! -path './grpo_step/tokenizer*' ! -name 'verl.log' \
     -exec cp --parents {} "$FINAL"/ \;)
  for m in "$OUT"/grpo_step/runs/*/metrics.jsonl; do [ -f "$m" ] && cp "$m" "$FINAL/$(basename "$(dirname "$m")")_metrics.jsonl"; done
  [ -f "$OUT/verl/verl.log" ] && tail -c 200000 "$OUT/verl/verl.log" > "$FINAL/verl_log_tail.txt"
  [ -f "$OUT/verl/verl.log" ] && grep -v -i "warn\|^\[[ 0-9.]*s\] *$" "$OUT/verl/verl.log" | head -c 400000 > "$FINAL/verl_log_head.txt"
  [ -d "$OUT/profile" ] && cp -r "$OUT/profile" "$FINAL/"
  if [ "$(find "$FINAL" -type f | wc -l)" -le 8 ]; then cp -r "$FINAL"/. "$final"/
  else tar -C "$FINAL" -czf "$final/results.tgz" . && cp "$FINAL/commands.txt" "$final/" 2>/dev/null; fi  # tar -xzf results.tgz
  rm -rf "$FINAL"; return 0; }
trap collect EXIT
export PYTHONPATH=/tmp/proj:/tmp/vsite TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0
SHAPE=${SHAPE:-0.5B}
step() { local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$OUT/commands.txt"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "exit $?" >> "$OUT/$name.log"; tail -n 30 "$OUT/$name.log"; }
free_gpu() { for p in /proc/[0-9]*; do  # processes holding the GPU open (nvidia-smi shows none in a container)
    [ "${p#/proc/}" = "$$" ] && continue
    ls -l "$p/fd" 2>/dev/null | grep -q /dev/nvidia && kill -9 "${p#/proc/}" 2>/dev/null; done; sleep 2
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader | tee -a "$OUT/commands.txt"; }
for stage in "$@"; do case $stage in
  unpack) if [ ! -d /tmp/vsite/vllm ]; then
            mkdir -p /tmp/vsite && cat /tmp/vstage/part.* | LD_LIBRARY_PATH=.gpu-vllm/tools .gpu-vllm/tools/zstd -d -q | tar -C /tmp/vsite -xf -
          fi
          python3 -c "import pytest" 2>/dev/null || { [ -d .gpu/extra ] && python3 -m pip install -q --no-deps --no-index --target /tmp/vsite .gpu/extra/*.whl; }
          if [ -d .gpu-verl/c1 ] && [ ! -d /tmp/verl/verl ]; then  # verl's bundle: one chunk, carried with this call
            mkdir -p /tmp/verl && cat .gpu-verl/c*/part.* | LD_LIBRARY_PATH=.gpu-vllm/tools .gpu-vllm/tools/zstd -d -q | tar -C /tmp/verl -xf -
          fi
          ls /tmp/vsite | wc -l; ls /tmp/verl 2>/dev/null | wc -l ;;
  setup) python3 -m pip install -q --no-deps --no-index --no-build-isolation --target /tmp/proj ./core ./plugins/vllm \
           ./plugins/fsdp ./plugins/megatron > "$OUT/setup.log" 2>&1; echo "setup exit $?"
         nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/setup.log" ;;
  tests) step tests 200 python3 -m pytest core/tests/transports/test_ipc.py -v -rA --junitxml="$OUT/tests.xml" ;;
  sync) for s in 0.5B 1.5B 7B; do free_gpu
          step "sync-$s" 230 python3 benchmarks/vllm_gpu.py --batch --sync-shapes "$s" --bucket-mib 512 --repeats 5 \
            --out "$OUT/vllm_sync_$s.json"; done ;;
  sync-small) for s in 0.5B 1.5B; do free_gpu
          step "sync-$s" 200 python3 benchmarks/vllm_gpu.py --batch --sync-shapes "$s" --bucket-mib 512 --repeats 5 \
            --out "$OUT/vllm_sync_$s.json"; done ;;
  throughput|throughput7) free_gpu  # throughput7: 7 repeats, without the per-request-seed system
          runs="--repeats 5 --request-seeds"; [ "$stage" = throughput7 ] && runs="--repeats 7"
          step throughput 330 python3 benchmarks/vllm_gpu.py --batch 64 256 --new-tokens 256 --shape 0.5B --sync-shapes \
            $runs --out "$OUT/vllm_throughput.json" ;;
  step) free_gpu  # STEP_OVERRIDES: more rlcore key=value (a fallback, e.g. transport.name=ray)
        step "grpo-step-$SHAPE" 560 python3 benchmarks/grpo_step_gpu.py --shape "$SHAPE" --steps 4 --timeout 520 \
          --out "$OUT/grpo_step" ${STEP_OVERRIDES:-} ;;
  step-raw) free_gpu  # the bound's raw vLLM run alone (writes the model and prompts too)
        step "grpo-raw-$SHAPE" 300 python3 benchmarks/grpo_step_gpu.py --shape "$SHAPE" --skip-rlcore --timeout 280 \
          --out "$OUT/grpo_step" ;;
  step-rlcore) free_gpu  # rlcore train alone: 5 steps, the last one profiled (out of the medians)
        step "grpo-rlcore-$SHAPE" 580 python3 benchmarks/grpo_step_gpu.py --shape "$SHAPE" --skip-raw --steps 5 \
          --profile-step 5 --timeout 560 --out "$OUT/grpo_step" ${STEP_OVERRIDES:-}
        mkdir -p "$OUT/profile" && cp -r "$OUT"/grpo_step/runs/grpo_step/profile/. "$OUT/profile/" 2>/dev/null ;;
  step-named) free_gpu  # NAME=run STEPS=n PROFILE=k (0: none) STEP_OVERRIDES="key=value ...": one rlcore run beside
        # the others, with the bound from the step-raw run of this machine (its raw_generate.json) in NAME_SHAPE.json
        name=${NAME:?NAME=run name}; steps=${STEPS:-5}; prof=${PROFILE:-$steps}
        [ -f "$OUT/grpo_step/raw_generate.json" ] && [ ! -f "$OUT/grpo_step/${name}_$SHAPE.json" ] &&
          python3 -c "import json,sys; json.dump({'raw_generate': json.load(open(sys.argv[1]))}, open(sys.argv[2], 'w'))" \
            "$OUT/grpo_step/raw_generate.json" "$OUT/grpo_step/${name}_$SHAPE.json"
        step "grpo-$name-$SHAPE" ${LIMIT:-570} python3 benchmarks/grpo_step_gpu.py --shape "$SHAPE" --skip-raw --steps "$steps" \
          --profile-step "$prof" --timeout $(( ${LIMIT:-570} - 15 )) --name "$name" --out "$OUT/grpo_step" ${STEP_OVERRIDES:-}
        mkdir -p "$OUT/logs-$name" "$OUT/profile-$name"  # flat: collect copies two levels deep
        for f in "$OUT/grpo_step/runs/$name"/logs/*.log; do [ -f "$f" ] && tail -c 200000 "$f" > "$OUT/logs-$name/$(basename "$f")"; done
        for f in "$OUT/grpo_step/runs/$name"/profile/*/*.txt; do
          [ -f "$f" ] && cp "$f" "$OUT/profile-$name/$(basename "$(dirname "$f")")-$(basename "$f")"; done ;;
  verl-bg) free_gpu; mkdir -p "$OUT/verl"  # verl outlives one call: started detached, awaited by wait-verl
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/verl/gpu_memory.csv" &
        echo $! > "$OUT/verl/smi.pid"
        PYTHONPATH=/tmp/proj:/tmp/verl:/tmp/vsite setsid nohup python3 benchmarks/verl_grpo_step.py \
          --model "$OUT/grpo_step/qwen2-$SHAPE" --shape "$SHAPE" --prompts-file "$OUT/grpo_step/prompts.jsonl" \
          --work /tmp/verl_work --steps ${VERL_STEPS:-3} --timeout 1500 --out "$OUT/verl" > "$OUT/verl-bg.log" 2>&1 &
        echo $! > "$OUT/verl/pid"; echo "verl started: $(cat "$OUT/verl/pid")" ;;
  wait-verl) pid=$(cat "$OUT/verl/pid"); timeout ${WAIT:-570} tail --pid="$pid" -f /dev/null
        if kill -0 "$pid" 2>/dev/null; then echo "verl still running"; grep -c "step:" "$OUT/verl/verl.log" 2>/dev/null
        else echo "verl done"; kill "$(cat "$OUT/verl/smi.pid")" 2>/dev/null; tail -n 30 "$OUT/verl-bg.log"; fi ;;
  step-again) free_gpu  # the same run again (its reproduction), and VARIANT="name key=value ..." beside it
        step "grpo-step-again-$SHAPE" 300 python3 benchmarks/grpo_step_gpu.py --shape "$SHAPE" --steps 4 --timeout 280 \
          --skip-raw --name again --out "$OUT/grpo_step" ${STEP_OVERRIDES:-}
        if [ -n "${VARIANT:-}" ]; then set -- $VARIANT; name=$1; shift; free_gpu
          step "grpo-step-$name-$SHAPE" 280 python3 benchmarks/grpo_step_gpu.py --shape "$SHAPE" --steps 4 \
            --timeout 260 --skip-raw --name "$name" --out "$OUT/grpo_step" "$@"; fi ;;
  verl|verl-fg) free_gpu; mkdir -p "$OUT/verl"  # VERL_STEPS, VERL_TIMEOUT: 4, 520 s (verl-fg, in a chain: 2, 900 s)
        if [ "$stage" = verl ]; then steps=${VERL_STEPS:-4} limit=${VERL_TIMEOUT:-520}
        else steps=${VERL_STEPS:-2} limit=${VERL_TIMEOUT:-900}; fi
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/verl/gpu_memory.csv" &
        smi=$!
        PYTHONPATH=/tmp/proj:/tmp/verl:/tmp/vsite step "verl-$SHAPE" $(( limit + 60 )) python3 benchmarks/verl_grpo_step.py \
          --model "$OUT/grpo_step/qwen2-$SHAPE" --shape "$SHAPE" --prompts-file "$OUT/grpo_step/prompts.jsonl" \
          --work /tmp/verl_work --steps "$steps" --timeout "$limit" --out "$OUT/verl"
        kill $smi ;;
  inputs) step inputs 120 python3 benchmarks/grpo_step_gpu.py --shape "$SHAPE" --skip-raw --skip-rlcore \
            --out "$OUT/grpo_step" ;;  # the model folder and prompt file alone (what verl-bg reads)
  chain) free_gpu; mkdir -p "$OUT/verl"  # CHAIN="stage ..." one after another, detached: they outlive this call
        # (verl alone takes most of 15 minutes); wait-chain waits and brings back what has finished.
        chain_start "OUT= RES=$OUT" ;;
  wait-chain) chain_wait 560 40 ;;
  megatron-seq-0.5b|megatron-seq-1.5b) free_gpu  # Megatron beside FSDP on this one GPU (megatron_h100.sh, this bundle)
        mkdir -p "$OUT/megatron"; OUT="$OUT/megatron" SITE=/tmp/vsite bash benchmarks/gpu/megatron_h100.sh "${stage#megatron-}" ;;
  compare) step compare 120 python3 benchmarks/grpo_step_gpu.py --shape "$SHAPE" --skip-raw --skip-rlcore \
             --out "$OUT/grpo_step" --verl "$OUT/verl" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac; done
