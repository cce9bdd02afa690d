#!/usr/bin/env bash
# The Megatron rows of docs/benchmarks.md (issue #17) on the lent 2-GPU machine, next to the FSDP engine.
#   bash benchmarks/gpu/megatron_h100.sh [stage ...]     (results and logs under $OUT, default /tmp/out)
# Needs the SGLang bundle unpacked and the project installed first (it carries megatron-core 0.19.2):
#   bash benchmarks/gpu/sglang_h100.sh unpack setup
# Stages (each runs the two engines at once, one per GPU, on the same workload of benchmarks/_workload.py):
#   pair-0.5b    Megatron TP=1 (packed var-len attention, chunked head) on GPU A, FSDP's tuned setting on GPU B
#   pair-1.5b    the same for the 1.5B shape at 256k tokens per step (the MFU rows)
#   swap-0.5b, swap-1.5b   the same pairs with the GPUs swapped (the independent re-run of each row)
#   tp2          Megatron TP=2, PP=2 and DP=2 on both GPUs (0.5B), for the scaling rows against pair-0.5b
#   compile-0.5b, compile-1.5b   Megatron TP=1 with megatron.compile on GPU 0 beside the same without on GPU 1
#   profile      Megatron TP=1 (0.5B) with one profiled step: $OUT/profile/megatron-qwen2.5-0.5b-tp1.txt
#   7b           a 7B shape over both GPUs (2 x H200): Megatron TP=2, then the FSDP engine on the same two
#                GPUs, the same steps (65,536 tokens per GPU, micro-batches of 4,096 tokens)
#   tp2-1.5b     Megatron TP=2 and DP=2 on both GPUs (1.5B)
#   seq-0.5b, seq-1.5b   on ONE GPU, one after another: Megatron TP=1 with megatron.compile, the same without,
#                then FSDP's tuned setting (the -h100 rows on the one-GPU kind)
# SITE=/tmp/vsite runs on the vLLM bundle instead (it carries megatron-core 0.19.2 too; step_h100.sh setup
# installs plugins/megatron beside it).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/proj:${SITE:-/tmp/site} TOKENIZERS_PARALLELISM=false
MODELS=/tmp/rlcore-bench-models
MEGATRON="--remove-padding --logits-chunk-size 4096 --max-tokens-per-micro-batch 16384"
FSDP="--systems fsdp-mp-varlen-compile --no-reshard-after-forward --reduce-grads-once-per-step \
  --max-tokens-per-micro-batch 16384 --logits-chunk-size 4096 --no-recompute-logits"
run() { local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$OUT/commands.txt"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "exit $?" >> "$OUT/$name.log"; }
# pair NAME MODEL TOKENS STEPS WARMUP MEGATRON_GPU FSDP_GPU: both engines at once, one GPU each.
pair() { local name=$1 model=$2 tokens=$3 steps=$4 warmup=$5 ga=$6 gb=$7
  local common="--tokens-per-step $tokens --steps $steps --warmup $warmup"
  save_model "$model"
  CUDA_VISIBLE_DEVICES=$ga run "$name-megatron" 500 python3 benchmarks/megatron_gpu.py --gpus 1 --layouts tp1 \
    --model "$model" --model-dir $MODELS $MEGATRON $common --profile "$OUT/profile-$name" --out "$OUT/$name-megatron.json" &
  CUDA_VISIBLE_DEVICES=$gb run "$name-fsdp" 500 python3 benchmarks/fsdp_train.py --gpus 1 --models "$model" \
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
mkdir -p $MODELS
for stage in "$@"; do case $stage in
  pair-0.5b) pair pair-0.5b qwen2.5-0.5b 65536 5 3 0 1 ;;
  swap-0.5b) pair swap-0.5b qwen2.5-0.5b 65536 5 3 1 0 ;;
  pair-1.5b) pair pair-1.5b qwen2.5-1.5b 262144 3 2 0 1 ;;
  swap-1.5b) pair swap-1.5b qwen2.5-1.5b 262144 3 2 1 0 ;;
  compile-0.5b|compile-1.5b) model=qwen2.5-${stage#compile-}; save_model $model
         common=$(workload $model)
         CUDA_VISIBLE_DEVICES=0 run $stage-on 500 python3 benchmarks/megatron_gpu.py --gpus 1 --layouts tp1 --model $model \
           --model-dir $MODELS $MEGATRON $common --compile --out "$OUT/$stage-on.json" &
         CUDA_VISIBLE_DEVICES=1 run $stage-off 500 python3 benchmarks/megatron_gpu.py --gpus 1 --layouts tp1 --model $model \
           --model-dir $MODELS $MEGATRON $common --out "$OUT/$stage-off.json" &
         wait; grep -h "^tp1" "$OUT/$stage-on.log" "$OUT/$stage-off.log" ;;
  seq-0.5b|seq-1.5b) model=qwen2.5-${stage#seq-}; save_model $model
         common=$(workload $model)
         run $stage-megatron-compile 400 python3 benchmarks/megatron_gpu.py --gpus 1 --layouts tp1 --model $model \
           --model-dir $MODELS $MEGATRON $common --compile --out "$OUT/$stage-megatron-compile.json"
         run $stage-megatron-eager 400 python3 benchmarks/megatron_gpu.py --gpus 1 --layouts tp1 --model $model \
           --model-dir $MODELS $MEGATRON $common --out "$OUT/$stage-megatron-eager.json"
         run $stage-fsdp 400 python3 benchmarks/fsdp_train.py --gpus 1 --models $model $FSDP $common \
           --model-dir $MODELS --out "$OUT/$stage-fsdp.json"
         grep -h "^tp1" "$OUT/$stage-megatron-compile.log" "$OUT/$stage-megatron-eager.log"; tail -n 3 "$OUT/$stage-fsdp.log" ;;
  7b) save_model qwen2.5-7b
         common="--tokens-per-step 65536 --max-tokens-per-micro-batch 4096 --steps 3 --warmup 2"
         run 7b-megatron 560 python3 benchmarks/megatron_gpu.py --gpus 2 --layouts tp2 --model qwen2.5-7b \
           --model-dir $MODELS --remove-padding --logits-chunk-size 4096 $common --out "$OUT/7b-megatron.json"
         grep -h "^tp2" "$OUT/7b-megatron.log"
         run 7b-fsdp 560 python3 benchmarks/fsdp_train.py --gpus 2 --models qwen2.5-7b --systems fsdp-mp-varlen-compile \
           --no-reshard-after-forward --reduce-grads-once-per-step --logits-chunk-size 4096 --no-recompute-logits \
           $common --model-dir $MODELS --out "$OUT/7b-fsdp.json"
         tail -n 3 "$OUT/7b-fsdp.log" ;;
  profile) save_model qwen2.5-0.5b; CUDA_VISIBLE_DEVICES=0 run profile 300 python3 benchmarks/megatron_gpu.py \
         --gpus 1 --layouts tp1 --model qwen2.5-0.5b --model-dir $MODELS $MEGATRON --tokens-per-step 65536 \
         --steps 2 --warmup 2 --profile "$OUT/profile" --out "$OUT/profile-0.5b.json"; grep -h "^tp1" "$OUT/profile.log" ;;
  tp2) save_model qwen2.5-0.5b; run tp2 400 python3 benchmarks/megatron_gpu.py --gpus 2 --layouts tp2 dp2 pp2 --model qwen2.5-0.5b \
         --model-dir $MODELS $MEGATRON --overlap-grad-reduce --tokens-per-step 65536 --steps 5 --warmup 3 \
         --out "$OUT/tp2-0.5b.json"; grep -h "^tp2\|^dp2\|^pp2" "$OUT/tp2.log" ;;
  tp2-1.5b) save_model qwen2.5-1.5b; run tp2-1.5b 400 python3 benchmarks/megatron_gpu.py --gpus 2 --layouts tp2 dp2 --model qwen2.5-1.5b \
         --model-dir $MODELS $MEGATRON --overlap-grad-reduce --tokens-per-step 262144 --steps 3 --warmup 2 \
         --out "$OUT/tp2-1.5b.json"; grep -h "^tp2\|^dp2" "$OUT/tp2-1.5b.log" ;;
  pack-out) # Last: everything under $OUT in one archive (the device tool returns at most 8 files a call).
         tar -C "$OUT" -czf /tmp/results.tgz . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/results.tgz" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac; done
