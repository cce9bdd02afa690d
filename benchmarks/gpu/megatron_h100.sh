#!/usr/bin/env bash
# The Megatron rows of docs/benchmarks.md (issue #17) on the lent GPU machine, next to the FSDP engine.
#   bash benchmarks/gpu/megatron_h100.sh [stage ...]     (results and logs under $OUT, default /tmp/out)
# On a fresh machine, one call: `bash benchmarks/gpu/megatron_bundle.sh` here once, then carry
# [".gpu-mcore/c1", ".gpu-mcore/tools"] and run `bash benchmarks/gpu/megatron_h100.sh unpack setup ...`
# (megatron-core 0.19.2 and rlcore's missing imports into /tmp/msite; core, fsdp, megatron into /tmp/proj).
# Runs that outlive a call: `OUT=/tmp/res CHAIN="stage ..." ... chain`, then `OUT=/tmp/res WAIT=500 ...
# wait-chain` in the next calls until "chain done" (within 30 s of each other: the machine idles out), then
# `CALL_OUT=$OUT OUT=/tmp/res ... collect` packs /tmp/res into the call's $OUT as results.tgz.
# SITE=/tmp/site runs on the SGLang bundle instead (sglang_h100.sh unpack setup), SITE=/tmp/vsite on the
# vLLM bundle (step_h100.sh unpack setup); both carry megatron-core 0.19.2 too.
# Stages:
#   unpack, setup  the Megatron bundle and the project, as above
#   pair-0.5b    Megatron TP=1 (packed var-len attention, chunked head) on GPU A, FSDP's tuned setting on GPU B
#   pair-1.5b    the same for the 1.5B shape at 256k tokens per step (the MFU rows)
#   swap-0.5b, swap-1.5b   the same pairs with the GPUs swapped (the independent re-run of each row)
#   tp2          Megatron TP=2, PP=2 and DP=2 on both GPUs (0.5B), for the scaling rows against seq-0.5b,
#                each layout profiling one more step ($OUT/profile-tp2)
#   compile-0.5b, compile-1.5b   Megatron TP=1 with megatron.compile on GPU 0 beside the same without on GPU 1
#   profile      Megatron TP=1 (0.5B) with one profiled step: $OUT/profile/megatron-qwen2.5-0.5b-tp1.txt
#   7b           a 7B shape over both GPUs (2 x H200): Megatron TP=2, then the FSDP engine on the same two
#                GPUs, the same steps (65,536 tokens per GPU, micro-batches of 4,096 tokens)
#   tp2-1.5b     Megatron TP=2 and DP=2 on both GPUs (1.5B)
#   tp2-only, tp2-only-rerun   Megatron TP=2 alone (0.5B), the first profiled: the TP=2 row and its re-run
#   seq-0.5b, seq-1.5b   on ONE GPU, one after another: Megatron TP=1 with megatron.compile, the same without
#                (EAGER=0 skips it), then FSDP's tuned setting (SKIP_FSDP=1 skips it; the -h100 rows on
#                the one-GPU kind); the
#                compiled Megatron run and FSDP each profile one more step (top operators, idle gaps)
#   rerun-0.5b, rerun-1.5b   seq-* again on the one GPU, named rerun-* (the independent re-run of its rows)
#   run3-0.5b, run3-1.5b     a third time, named run3-* (a median of three)
#   nccl         the GPUs' topology and NCCL all-reduce times at a TP=2 step's sizes (allreduce_probe.py)
#   seq2-0.5b, seq2-1.5b   seq-* on each of two GPUs at once, independently (GPU 0: seq-*, GPU 1: rerun-*):
#                the row and its independent re-run from one call
#   mb32k        micro-batches of 32,768 tokens (0.5B): Megatron TP=1 on GPU 0 alone, then TP=2 on both. At
#                16,384, TP=2 runs twice TP=1's micro-batches per step (its step holds both GPUs' tokens),
#                so twice its host work (kernel launches, guards) for the same work per GPU; at 32,768
#                TP=2 runs TP=1's count. TP=1 at 32,768 too, so that its baseline is no weaker.
#   tp1-0.5b, tp1-1.5b   Megatron TP=1 (compiled) alone on GPU 0: the TP=2 scaling rows' baseline, on the host
#                and in the call of the TP=2 runs
#   tp2-1.5b-only, tp2-1.5b-rerun   Megatron TP=2 alone (1.5B, the tp1-1.5b workload per GPU): the row, re-run
#   mb32k-threads  TP=2 at 32,768-token micro-batches (0.5B) with 2 intra-op threads a rank, then with the
#                default (the host's cores shared out, 16 a rank on 32 cores): whether the step's host stalls
#                (15-24 ms gaps in aten::index on 2 x H200) come from oversubscribed host threads
#   tp2-keep-0.5b, tp2-keep-1.5b   Megatron TP=2 alone (compiled), the vocabulary-parallel head keeping each
#                rank's logits slice from the forward (--no-recompute-logits, as TP=1 does), at 32,768-token
#                micro-batches (TP=1's micro-batch count per step): against tp1-0.5b / tp1-1.5b
#   topo         the GPUs' topology (nvidia-smi topo -m) and names into $OUT/topo.txt: which link TP=2 had
#   tp2, tp2-1.5b and 7b compile Megatron too (COMPILE=0: not)
set -uo pipefail
# shellcheck source=benchmarks/gpu/call_lib.sh
source "$(dirname "$0")/call_lib.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/proj:${SITE:-/tmp/msite} TOKENIZERS_PARALLELISM=false
MODELS=/tmp/rlcore-bench-models
# Two runs side by side (pairs, compile-*, seq2-*) each take half the host's cores (_workload.host_threads).
HALF=$(( $(nproc) / 2 ))
MEGATRON="--remove-padding --logits-chunk-size 4096 --max-tokens-per-micro-batch 16384"
# At TP=1 the head keeps its logits for the backward, as FSDP's setting below does (--no-recompute-logits).
# The TP=2 stages before tp2-keep-* recompute them (the vocabulary-parallel head could not keep them then).
TP1="$MEGATRON --no-recompute-logits"
FSDP="--systems fsdp-mp-varlen-compile --no-reshard-after-forward --reduce-grads-once-per-step \
  --max-tokens-per-micro-batch 16384 --logits-chunk-size 4096 --no-recompute-logits"
run() { local name=$1 limit=$2 t0=$SECONDS; shift 2
  echo "== $name ($(date +%T)): $*" | tee -a "$OUT/commands.txt"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "exit $? after $((SECONDS - t0)) s" >> "$OUT/$name.log"; }
# pair NAME MODEL TOKENS STEPS WARMUP MEGATRON_GPU FSDP_GPU: both engines at once, one GPU each.
pair() { local name=$1 model=$2 tokens=$3 steps=$4 warmup=$5 ga=$6 gb=$7
  local common="--tokens-per-step $tokens --steps $steps --warmup $warmup"
  save_model "$model"
  CUDA_VISIBLE_DEVICES=$ga BENCH_HOST_CPUS=$HALF run "$name-megatron" 500 python3 benchmarks/megatron_gpu.py --gpus 1 --layouts tp1 \
    --model "$model" --model-dir $MODELS $TP1 $common --profile "$OUT/profile-$name" --out "$OUT/$name-megatron.json" &
  CUDA_VISIBLE_DEVICES=$gb BENCH_HOST_CPUS=$HALF run "$name-fsdp" 500 python3 benchmarks/fsdp_train.py --gpus 1 --models "$model" \
    $FSDP $common --model-dir $MODELS --out "$OUT/$name-fsdp.json" &
  wait; grep -h "^tp1" "$OUT/$name-megatron.log"; tail -n 3 "$OUT/$name-fsdp.log"; }
# The per-GPU workload of the compile and seq stages (the pairs' numbers): 0.5B 65,536 tokens a step, 5
# timed after 3; 1.5B 262,144, 3 after 2.
workload() { if [ "$1" = qwen2.5-0.5b ]; then echo "--tokens-per-step 65536 --steps 5 --warmup 3"
  else echo "--tokens-per-step 262144 --steps 3 --warmup 2"; fi; }
# The random model once, before two processes would both write it.
save_model() { python3 -c "
import sys, torch; sys.path.insert(0, 'benchmarks')
from pathlib import Path; from _workload import save_random_model
print(save_random_model('$1', Path('$MODELS'), torch.device('cuda')))" >> "$OUT/models.log" 2>&1; }
# rows NAME MODEL: Megatron compiled (profiled), eager (unless EAGER=0), FSDP (profiled) on the visible GPU.
rows() { local stage=$1 model=$2 common; common=$(workload "$model")
  run "$stage-megatron-compile" 400 python3 benchmarks/megatron_gpu.py --gpus 1 --layouts tp1 --model "$model" \
    --model-dir $MODELS $TP1 $common --compile --profile "$OUT/profile-$stage-megatron" \
    --out "$OUT/$stage-megatron-compile.json"
  [ "${EAGER:-1}" = 0 ] || run "$stage-megatron-eager" 400 python3 benchmarks/megatron_gpu.py --gpus 1 --layouts tp1 \
    --model "$model" --model-dir $MODELS $TP1 $common --out "$OUT/$stage-megatron-eager.json"
  [ "${SKIP_FSDP:-0}" = 1 ] || run "$stage-fsdp" 400 python3 benchmarks/fsdp_train.py --gpus 1 --models "$model" $FSDP $common \
    --model-dir $MODELS --profile "$OUT/profile-$stage-fsdp" --out "$OUT/$stage-fsdp.json"
  grep -h "^tp1" "$OUT/$stage-megatron-"*.log; tail -n 3 "$OUT/$stage-fsdp.log"; }
TP2_COMPILE=$([ "${COMPILE:-1}" = 0 ] || echo --compile)
mkdir -p $MODELS
for stage in "$@"; do case $stage in
  unpack) if [ ! -d /tmp/msite/megatron ]; then mkdir -p /tmp/msite && cat .gpu-mcore/c1/part.* \
            | LD_LIBRARY_PATH=.gpu-mcore/tools .gpu-mcore/tools/zstd -d -q | tar -C /tmp/msite -xf -; fi
          ls /tmp/msite ;;
  setup) rm -rf /tmp/proj; python3 -m pip install -q --no-deps --no-index --no-build-isolation --target /tmp/proj ./core \
           ./plugins/fsdp ./plugins/megatron > "$OUT/setup.log" 2>&1; echo "setup exit $?"
         nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/setup.log" ;;
  chain) chain_start "OUT=$OUT" ;;  # CHAIN="stage ..." one after another, detached: they outlive this call
  wait-chain) chain_wait 500 30 ;;
  collect) mkdir -p "${CALL_OUT:-/tmp/out-call}"; tar -C "$OUT" -czf "${CALL_OUT:-/tmp/out-call}/results.tgz" . ;;
  pair-0.5b) pair pair-0.5b qwen2.5-0.5b 65536 5 3 0 1 ;;
  swap-0.5b) pair swap-0.5b qwen2.5-0.5b 65536 5 3 1 0 ;;
  pair-1.5b) pair pair-1.5b qwen2.5-1.5b 262144 3 2 0 1 ;;
  swap-1.5b) pair swap-1.5b qwen2.5-1.5b 262144 3 2 1 0 ;;
  compile-0.5b|compile-1.5b) model=qwen2.5-${stage#compile-}; save_model $model
         common=$(workload $model)
         CUDA_VISIBLE_DEVICES=0 BENCH_HOST_CPUS=$HALF run $stage-on 500 python3 benchmarks/megatron_gpu.py --gpus 1 --layouts tp1 --model $model \
           --model-dir $MODELS $TP1 $common --compile --out "$OUT/$stage-on.json" &
         CUDA_VISIBLE_DEVICES=1 BENCH_HOST_CPUS=$HALF run $stage-off 500 python3 benchmarks/megatron_gpu.py --gpus 1 --layouts tp1 --model $model \
           --model-dir $MODELS $TP1 $common --out "$OUT/$stage-off.json" &
         wait; grep -h "^tp1" "$OUT/$stage-on.log" "$OUT/$stage-off.log" ;;
  seq-0.5b|seq-1.5b|rerun-0.5b|rerun-1.5b|run3-0.5b|run3-1.5b) model=qwen2.5-${stage#*-}; save_model $model
         rows $stage $model ;;
  seq2-0.5b|seq2-1.5b) model=qwen2.5-${stage#seq2-}; save_model $model
         (export CUDA_VISIBLE_DEVICES=0 BENCH_HOST_CPUS=$HALF; rows seq-${stage#seq2-} $model) &
         (export CUDA_VISIBLE_DEVICES=1 BENCH_HOST_CPUS=$HALF; rows rerun-${stage#seq2-} $model) &
         wait ;;
  7b) save_model qwen2.5-7b
         common="--tokens-per-step 65536 --max-tokens-per-micro-batch 4096 --steps 3 --warmup 2"
         run 7b-megatron 560 python3 benchmarks/megatron_gpu.py --gpus 2 --layouts tp2 --model qwen2.5-7b \
           --model-dir $MODELS --remove-padding --logits-chunk-size 4096 $TP2_COMPILE $common --out "$OUT/7b-megatron.json"
         grep -h "^tp2" "$OUT/7b-megatron.log"
         run 7b-fsdp 560 python3 benchmarks/fsdp_train.py --gpus 2 --models qwen2.5-7b --systems fsdp-mp-varlen-compile \
           --no-reshard-after-forward --reduce-grads-once-per-step --logits-chunk-size 4096 --no-recompute-logits \
           $common --model-dir $MODELS --out "$OUT/7b-fsdp.json"
         tail -n 3 "$OUT/7b-fsdp.log" ;;
  profile) save_model qwen2.5-0.5b; CUDA_VISIBLE_DEVICES=0 run profile 300 python3 benchmarks/megatron_gpu.py \
         --gpus 1 --layouts tp1 --model qwen2.5-0.5b --model-dir $MODELS $TP1 --tokens-per-step 65536 \
         --steps 2 --warmup 2 --profile "$OUT/profile" --out "$OUT/profile-0.5b.json"; grep -h "^tp1" "$OUT/profile.log" ;;
  tp2) save_model qwen2.5-0.5b; run tp2 400 python3 benchmarks/megatron_gpu.py --gpus 2 --layouts tp2 dp2 pp2 --model qwen2.5-0.5b \
         --model-dir $MODELS $MEGATRON $TP2_COMPILE --overlap-grad-reduce --tokens-per-step 65536 --steps 5 --warmup 3 \
         --profile "$OUT/profile-tp2" --out "$OUT/tp2-0.5b.json"; grep -h "^tp2\|^dp2\|^pp2" "$OUT/tp2.log" ;;
  tp2-only|tp2-only-rerun) save_model qwen2.5-0.5b
         prof=$([ $stage = tp2-only ] && echo "--profile $OUT/profile-$stage")
         run $stage 300 python3 benchmarks/megatron_gpu.py --gpus 2 --layouts tp2 --model qwen2.5-0.5b --model-dir $MODELS \
         $MEGATRON $TP2_COMPILE --tokens-per-step 65536 --steps 5 --warmup 3 $prof --out "$OUT/$stage-0.5b.json"
         grep -h "^tp2" "$OUT/$stage.log" ;;
  tp2-1.5b) save_model qwen2.5-1.5b; run tp2-1.5b 400 python3 benchmarks/megatron_gpu.py --gpus 2 --layouts tp2 dp2 --model qwen2.5-1.5b \
         --model-dir $MODELS $MEGATRON $TP2_COMPILE --overlap-grad-reduce --tokens-per-step 262144 --steps 3 --warmup 2 \
         --out "$OUT/tp2-1.5b.json"; grep -h "^tp2\|^dp2" "$OUT/tp2-1.5b.log" ;;
  tp1-0.5b|tp1-1.5b) model=qwen2.5-${stage#tp1-}; save_model $model
         CUDA_VISIBLE_DEVICES=0 run $stage 400 python3 benchmarks/megatron_gpu.py --gpus 1 --layouts tp1 --model $model \
           --model-dir $MODELS $TP1 $(workload $model) --compile --out "$OUT/$stage.json"
         grep -h "^tp1" "$OUT/$stage.log" ;;
  tp2-1.5b-only|tp2-1.5b-rerun) save_model qwen2.5-1.5b
         run $stage 400 python3 benchmarks/megatron_gpu.py --gpus 2 --layouts tp2 --model qwen2.5-1.5b --model-dir $MODELS \
           $MEGATRON $TP2_COMPILE $(workload qwen2.5-1.5b) --out "$OUT/$stage.json"
         grep -h "^tp2" "$OUT/$stage.log" ;;
  mb32k) save_model qwen2.5-0.5b; big="--max-tokens-per-micro-batch 32768"
         CUDA_VISIBLE_DEVICES=0 run mb32k-tp1 400 python3 benchmarks/megatron_gpu.py --gpus 1 --layouts tp1 \
           --model qwen2.5-0.5b --model-dir $MODELS $TP1 $big $(workload qwen2.5-0.5b) --compile --out "$OUT/mb32k-tp1.json"
         run mb32k-tp2 400 python3 benchmarks/megatron_gpu.py --gpus 2 --layouts tp2 --model qwen2.5-0.5b \
           --model-dir $MODELS $MEGATRON $big $TP2_COMPILE $(workload qwen2.5-0.5b) --out "$OUT/mb32k-tp2.json"
         grep -h "^tp1\|^tp2" "$OUT/mb32k-tp1.log" "$OUT/mb32k-tp2.log" ;;
  mb32k-threads) save_model qwen2.5-0.5b
         for cpus in 4 ""; do name=mb32k-tp2-cpus${cpus:-all}
           BENCH_HOST_CPUS=$cpus run $name 300 python3 benchmarks/megatron_gpu.py --gpus 2 --layouts tp2 --model qwen2.5-0.5b \
             --model-dir $MODELS $MEGATRON --max-tokens-per-micro-batch 32768 $TP2_COMPILE $(workload qwen2.5-0.5b) \
             --out "$OUT/$name.json"; grep -h "^tp2" "$OUT/$name.log"; done ;;
  tp2-keep-0.5b|tp2-keep-1.5b) model=qwen2.5-${stage#tp2-keep-}; save_model $model
         run $stage 400 python3 benchmarks/megatron_gpu.py --gpus 2 --layouts tp2 --model $model --model-dir $MODELS \
           $TP1 --max-tokens-per-micro-batch 32768 $TP2_COMPILE $(workload $model) --out "$OUT/$stage.json"
         grep -h "^tp2" "$OUT/$stage.log" ;;
  topo) { nvidia-smi topo -m; nvidia-smi --query-gpu=name,pci.bus_id,clocks.max.sm --format=csv; nproc; } \
          >> "$OUT/topo.txt" 2>&1; cat "$OUT/topo.txt" ;;
  nccl) nvidia-smi topo -m > "$OUT/topo.txt" 2>&1; cat "$OUT/topo.txt"
        run nccl 120 python3 benchmarks/gpu/allreduce_probe.py --out "$OUT/allreduce.json"; cat "$OUT/nccl.log" ;;
  pack-out) pack_out ;;  # last: everything under $OUT in one archive (a call brings back at most 8 files)
  *) echo "unknown stage $stage"; exit 2 ;;
esac; done
