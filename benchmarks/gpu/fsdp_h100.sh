#!/usr/bin/env bash
# The FSDP rows of docs/benchmarks.md on the lent GPU machine (torch preinstalled, no registry):
#   bash benchmarks/gpu/fsdp_h100.sh [stage ...]     (results and logs under $OUT, default /tmp/out)
# Stages: setup (install the project into /tmp/proj), small (0.5B), large (1.5B), compile, scaling (1 vs 2 GPUs),
# and the later tuning stages below (each a row or comparison of docs/benchmarks.md).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/proj${PYTHONPATH:+:$PYTHONPATH} TOKENIZERS_PARALLELISM=false
bench() { local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$OUT/commands.txt"
  timeout "$limit" python3 benchmarks/fsdp_train.py --model-dir /tmp/models --out "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1; echo "exit $?" >> "$OUT/$name.log"; grep -A12 "^model" "$OUT/$name.log"; }
stages=("$@"); [ ${#stages[@]} -gt 0 ] || stages=(setup small large)
for stage in "${stages[@]}"; do case $stage in
  setup) python3 -m pip install -q --no-deps --no-index --no-build-isolation --target /tmp/proj ./core ./plugins/fsdp \
           > "$OUT/setup.log" 2>&1; nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/setup.log" ;;
  small) bench small 200 --models qwen2.5-0.5b --gpus 1 --systems hf-naive fsdp-mp-varlen fsdp-bf16-varlen \
           --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 4 --warmup 2 --profile "$OUT/profiles" ;;
  large) bench large 280 --models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen hf-naive \
           --tokens-per-step 65536 --max-tokens-per-micro-batch 8192 --steps 4 --warmup 2 --profile "$OUT/profiles" ;;
  compile) bench compile-small 200 --models qwen2.5-0.5b --gpus 1 --systems fsdp-mp-varlen-compile hf-naive \
           --tokens-per-step 65536 --max-tokens-per-micro-batch 8192 --steps 4 --warmup 3 --profile "$OUT/profiles"
           bench compile-large 300 --models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen-compile \
           --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 4 --warmup 3 --profile "$OUT/profiles" ;;
  scaling) bench scaling 430 --models qwen2.5-0.5b --gpus 1 2 --systems fsdp-mp-varlen-compile --reduce-grads-once-per-step \
           --no-reshard-after-forward --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 5 --warmup 3 ;;
  large-steps) L="--models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen-compile --no-reshard-after-forward --reduce-grads-once-per-step --max-tokens-per-micro-batch 16384 --logits-chunk-size 8192 --steps 4 --warmup 3"
         bench large-128k 230 $L --tokens-per-step 131072
         bench large-256k 260 $L --tokens-per-step 262144 --steps 3 --warmup 2 ;;
  scaling-final) bench scaling-final 430 --models qwen2.5-0.5b --gpus 1 2 --systems fsdp-mp-varlen-compile --reduce-grads-once-per-step \
           --no-reshard-after-forward --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --logits-chunk-size 4096 \
           --no-recompute-logits --steps 5 --warmup 3 ;;
  scaling-why) S="--models qwen2.5-0.5b --gpus 2 --systems fsdp-mp-varlen-compile --no-reshard-after-forward --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 4 --warmup 3"
         bench why-reduce-once 150 $S --reduce-grads-once-per-step --profile "$OUT/profiles"
         bench why-sync 120 $S
         bench why-foreach 120 $S --reduce-grads-once-per-step --no-fused-optimizer ;;
  tuned) bench naive-small 120 --models qwen2.5-0.5b --gpus 1 --systems hf-naive \
           --tokens-per-step 65536 --max-tokens-per-micro-batch 8192 --steps 4 --warmup 2
         bench tuned-small 200 --models qwen2.5-0.5b --gpus 1 --systems fsdp-mp-varlen-compile --no-reshard-after-forward \
           --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 4 --warmup 3 --profile "$OUT/profiles"
         bench tuned-large 230 --models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen-compile --no-reshard-after-forward \
           --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 4 --warmup 3 --profile "$OUT/profiles" ;;
  final) F="--tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 5 --warmup 3 --no-reshard-after-forward"
         bench final-small 170 --models qwen2.5-0.5b --gpus 1 --systems fsdp-mp-varlen-compile $F --reduce-grads-once-per-step
         bench final-large-sync 170 --models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen-compile $F
         bench final-large 200 --models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen-compile $F --reduce-grads-once-per-step \
           --profile "$OUT/profiles" ;;
  mfu) M="--models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen-compile --no-reshard-after-forward --reduce-grads-once-per-step --max-tokens-per-micro-batch 16384 --logits-chunk-size 8192 --tokens-per-step 262144 --steps 3 --warmup 2"
         bench mfu-first-fit 280 $M --first-fit-micro-batches
         bench mfu-balanced 300 $M --profile "$OUT/profiles" ;;
  mfu-logits) M="--models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen-compile --no-reshard-after-forward --reduce-grads-once-per-step --max-tokens-per-micro-batch 16384 --tokens-per-step 262144 --steps 3 --warmup 2"
         bench mfu-kept-logits 280 $M --logits-chunk-size 8192 --no-recompute-logits --profile "$OUT/profiles"
         bench mfu-kept-logits-4k 250 $M --logits-chunk-size 4096 --no-recompute-logits ;;
  mfu-final) M="--models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen-compile --no-reshard-after-forward --reduce-grads-once-per-step --max-tokens-per-micro-batch 16384 --tokens-per-step 262144 --steps 3 --warmup 2"
         S="--models qwen2.5-0.5b --gpus 1 --tokens-per-step 65536 --steps 5 --warmup 3"
         bench final-before 170 $M --logits-chunk-size 8192 --first-fit-micro-batches
         bench final-after 170 $M --logits-chunk-size 4096 --no-recompute-logits --profile "$OUT/profiles"
         bench final-small-naive 90 $S --systems hf-naive --max-tokens-per-micro-batch 8192
         bench final-small-after 120 $S --systems fsdp-mp-varlen-compile --no-reshard-after-forward --reduce-grads-once-per-step \
           --max-tokens-per-micro-batch 16384 --logits-chunk-size 4096 --no-recompute-logits ;;
esac; done
# A call brings back a limited number of files: the profiles travel as one archive.
[ -d "$OUT/profiles" ] && tar -C "$OUT" -czf "$OUT/profiles.tgz" profiles && rm -rf "$OUT/profiles"
