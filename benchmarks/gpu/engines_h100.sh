#!/usr/bin/env bash
# rlcore-vllm and rlcore-sglang side by side on one lent GPU: the "Choosing a rollout engine" rows of
# docs/benchmarks.md (issue 14). Both bundles are shipped first (README.md beside this script):
#   vLLM:   .gpu-vllm/c1..c5 -> /tmp/vstage (stage unpack-vllm unpacks into /tmp/vsite)
#   SGLang: .gpu/c1..c4      -> /tmp/stage  (stage unpack-sglang unpacks into /tmp/site, pytest too)
#   bash benchmarks/gpu/engines_h100.sh [stage ...]      (results and logs under $OUT, default /tmp/out)
# Stages: unpack-vllm, unpack-sglang, setup (the project, both plugins, into /tmp/proj), bench (both
# engines' benchmarks one after the other in this call, the same workload: benchmarks/sglang_gpu.py and
# benchmarks/vllm_gpu.py, then benchmarks/rollout_engines.py to put them side by side).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0
step() { local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$OUT/commands.txt"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "exit $?" >> "$OUT/$name.log"; tail -n 25 "$OUT/$name.log"; }
free_gpu() { for p in /proc/[0-9]*; do  # processes holding the GPU open (nvidia-smi shows none in a container)
    ls -l "$p/fd" 2>/dev/null | grep -q /dev/nvidia && kill -9 "${p#/proc/}" 2>/dev/null; done; sleep 3
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader | tee -a "$OUT/commands.txt"; }
ARGS="--batch 64 256 --new-tokens 256 --shape 0.5B --sync-shapes 0.5B 1.5B --bucket-mib 512 --repeats 3"
for stage in "$@"; do case $stage in
  unpack-vllm) if [ ! -d /tmp/vsite/vllm ]; then
                 mkdir -p /tmp/vsite && cat /tmp/vstage/part.* | LD_LIBRARY_PATH=.gpu-vllm/tools .gpu-vllm/tools/zstd -d -q | tar -C /tmp/vsite -xf -
               fi; ls /tmp/vsite | wc -l ;;
  unpack-sglang) bash benchmarks/gpu/sglang_h100.sh unpack ;;
  setup) python3 -m pip install -q --no-deps --no-index --no-build-isolation --target /tmp/proj ./core ./plugins/sglang \
           ./plugins/vllm ./plugins/fsdp ./plugins/megatron > "$OUT/setup.log" 2>&1; echo "setup exit $?"
         nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/setup.log" ;;
  bench) # SGLang's bundle pins transformers 5.12.1; vLLM runs on the machine's 5.17. Each in its own process.
         # A crashed earlier run can leave an engine's scheduler process holding most of the GPU: end them.
         free_gpu
         PYTHONPATH=/tmp/proj:/tmp/site step bench-sglang 280 python3 benchmarks/sglang_gpu.py $ARGS \
           --out "$OUT/sglang_gpu_h100.json"
         free_gpu
         # vLLM in-process keeps its memory after shutdown (a second engine in the process would not fit):
         # the 1.5B sync runs in a process of its own.
         PYTHONPATH=/tmp/proj:/tmp/vsite step bench-vllm 220 python3 benchmarks/vllm_gpu.py \
           ${ARGS/--sync-shapes 0.5B 1.5B/--sync-shapes 0.5B} --out "$OUT/vllm_gpu_h100.json"
         free_gpu
         PYTHONPATH=/tmp/proj:/tmp/vsite step bench-vllm-1.5b 150 python3 benchmarks/vllm_gpu.py \
           --batch --new-tokens 256 --shape 1.5B --sync-shapes 1.5B --bucket-mib 512 --repeats 3 \
           --out "$OUT/vllm_gpu_h100_1.5b.json"
         python3 benchmarks/rollout_engines.py "$OUT/vllm_gpu_h100.json" "$OUT/sglang_gpu_h100.json" \
           --more-vllm "$OUT/vllm_gpu_h100_1.5b.json" \
           --out "$OUT/rollout_engines_h100.json" | tee "$OUT/rollout_engines.log" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac; done
