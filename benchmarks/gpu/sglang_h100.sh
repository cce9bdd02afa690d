#!/usr/bin/env bash
# rlcore-sglang on the lent GPU machine: its GPU tests and the SGLang rows of docs/benchmarks.md.
#   bash benchmarks/gpu/sglang_h100.sh [stage ...]      (results and logs under $OUT, default /tmp/out)
# Stages: unpack (the shipped bundle into /tmp/site, pytest beside it), setup (the project into /tmp/proj),
# model (random Qwen2.5-0.5B-shaped model), tests (plugins/sglang/tests/test_engine_gpu.py on that model),
# bench (benchmarks/sglang_gpu.py). Each step has a timeout well inside a call's 600 s; see README.md.
set -uo pipefail
# shellcheck source=benchmarks/gpu/call_lib.sh
source "$(dirname "$0")/call_lib.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# The project first (its entry points), then the bundle, whose transformers 5.12.1 (SGLang's pin) must
# shadow the machine's 5.17.
export PYTHONPATH=/tmp/proj:/tmp/site TOKENIZERS_PARALLELISM=false
MODEL=/tmp/rlcore-bench-gpu/qwen2-0.5B
step() { local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$OUT/commands.txt"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "exit $?" >> "$OUT/$name.log"; tail -n 40 "$OUT/$name.log"; }
for stage in "$@"; do case $stage in
  unpack) if [ ! -d /tmp/site/sglang ]; then
            mkdir -p /tmp/stage /tmp/site && cp .gpu/c*/part.* /tmp/stage/ 2>/dev/null
            cat /tmp/stage/part.* | LD_LIBRARY_PATH=.gpu/tools .gpu/tools/zstd -d -q | tar -C /tmp/site -xf -
          fi
          python3 -c "import pytest" 2>/dev/null || python3 -m pip install -q --no-deps --no-index --target /tmp/site .gpu/extra/*.whl
          ls /tmp/site | wc -l ;;
  setup) python3 -m pip install -q --upgrade --no-deps --no-index --no-build-isolation --target /tmp/proj ./core ./plugins/sglang \
           ./plugins/fsdp ./plugins/megatron > "$OUT/setup.log" 2>&1; echo "setup exit $?"
         nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/setup.log" ;;
  model) step model 120 python3 -c "
import sys, torch; sys.path.insert(0, 'benchmarks')
from pathlib import Path
from vllm_gpu import save_model
Path('$MODEL').mkdir(parents=True, exist_ok=True); save_model(Path('$MODEL'), '0.5B', torch.device('cuda')); print('model ok')" ;;
  tests) RLCORE_SGLANG_TEST_MODEL=$MODEL step tests 330 python3 -m pytest plugins/sglang/tests/test_engine_gpu.py \
           -v -s -rA --junitxml="$OUT/tests.xml" ;;
  tests-multi) # On 2 GPUs: weights over sglang-distributed from GPU 0 into SGLang on GPU 1, and SGLang at tp_size=2.
         RLCORE_SGLANG_TEST_MODEL=$MODEL step tests-multi 420 python3 -m pytest plugins/sglang/tests/test_multi_gpu.py \
           -v -s -rA --junitxml="$OUT/tests-multi.xml" ;;
  tests-tp2) # On 2 GPUs: only SGLang at tp_size=2 (the contract suite and the re-sharded trainer sync).
         RLCORE_SGLANG_TEST_MODEL=$MODEL step tests-tp2 540 python3 -m pytest plugins/sglang/tests/test_multi_gpu.py \
           -k TestTensorParallel -v -s -rA --durations=0 --junitxml="$OUT/tests-tp2.xml" ;;
  probe-dist) # sglang-distributed in three environments, each in a fresh process (sglang_dist_probe.py).
         for variant in saver-on saver-off cumem-on; do
           step probe-$variant 150 python3 benchmarks/gpu/sglang_dist_probe.py $MODEL $variant
           pkill -9 -f "sglang_dist_prob[e]|sglang[:][:]" 2>/dev/null; sleep 2
         done ;;
  tests-tiny) step tests-tiny 300 python3 -m pytest plugins/sglang/tests/test_engine_gpu.py -v -s -rA \
           --junitxml="$OUT/tests-tiny.xml" ;;
  bench) step bench 420 python3 benchmarks/sglang_gpu.py --batch 64 256 --new-tokens 256 --shape 0.5B \
           --sync-shapes 0.5B 1.5B --bucket-mib 512 --repeats 3 --out "$OUT/sglang_gpu_h100.json" ;;
  bench-fast) step bench-fast 300 python3 benchmarks/sglang_gpu.py --batch 64 256 --new-tokens 256 --shape 0.5B \
           --sync-shapes 0.5B --bucket-mib 512 --repeats 3 --no-deterministic --out "$OUT/sglang_gpu_h100_nondet.json" ;;
  throughput) step throughput 200 python3 benchmarks/sglang_gpu.py --batch 64 256 --new-tokens 256 --shape 0.5B \
           --sync-shapes --repeats 9 --out "$OUT/sglang_gpu_h100_throughput.json" ;;
  throughput-fast) step throughput-fast 220 python3 benchmarks/sglang_gpu.py --batch 64 256 --new-tokens 256 --shape 0.5B \
           --sync-shapes --repeats 9 --no-deterministic --out "$OUT/sglang_gpu_h100_throughput_nondet.json" ;;
  train-fsdp) # The default demo (GRPO, copy_word task, tiny model) with SGLang as the rollout, colocated on one GPU.
         rm -rf runs/sglang-fsdp
         step train-fsdp 420 python3 -c "import sys; from rlcore.cli.main import main; sys.exit(main())" train \
           --engine fsdp --rollout sglang trainer.total_steps=15 trainer.experiment_name=sglang-fsdp
         cp runs/sglang-fsdp/metrics.jsonl "$OUT/train_fsdp_sglang.metrics.jsonl" 2>/dev/null
         tar -C runs/sglang-fsdp -czf "$OUT/train_fsdp_sglang_logs.tgz" logs config.yaml 2>/dev/null ;;
  train-megatron) # The headline command: the same run with the Megatron engine (TP=1 on this one GPU).
         rm -rf runs/sglang-megatron
         step train-megatron 420 python3 -c "import sys; from rlcore.cli.main import main; sys.exit(main())" train \
           --engine megatron --rollout sglang trainer.total_steps=15 trainer.experiment_name=sglang-megatron
         cp runs/sglang-megatron/metrics.jsonl "$OUT/train_megatron_sglang.metrics.jsonl" 2>/dev/null
         tar -C runs/sglang-megatron -czf "$OUT/train_megatron_sglang_logs.tgz" logs config.yaml error.log 2>/dev/null ;;
  train-megatron-tp2) # On 2 GPUs: the Megatron trainer at TP=2, SGLang colocated on the first GPU.
         rm -rf runs/sglang-megatron-tp2
         step train-megatron-tp2 420 python3 -c "import sys; from rlcore.cli.main import main; sys.exit(main())" train \
           --engine megatron --rollout sglang actor.world_size=2 megatron.tensor_model_parallel_size=2 \
           trainer.total_steps=15 trainer.experiment_name=sglang-megatron-tp2
         cp runs/sglang-megatron-tp2/metrics.jsonl "$OUT/train_megatron_tp2_sglang.metrics.jsonl" 2>/dev/null
         tar -C runs/sglang-megatron-tp2 -czf "$OUT/train_megatron_tp2_sglang_logs.tgz" logs config.yaml error.log 2>/dev/null ;;
  train-split) # On 2 GPUs: the FSDP trainer on one, SGLang on the other, weights over SGLang's NCCL group.
         rm -rf runs/sglang-split
         step train-split 420 python3 -c "import sys; from rlcore.cli.main import main; sys.exit(main())" train \
           --engine fsdp --rollout sglang trainer.placement=split transport.name=sglang-distributed \
           trainer.total_steps=15 trainer.experiment_name=sglang-split
         cp runs/sglang-split/metrics.jsonl "$OUT/train_split_sglang.metrics.jsonl" 2>/dev/null
         tar -C runs/sglang-split -czf "$OUT/train_split_sglang_logs.tgz" logs config.yaml error.log 2>/dev/null ;;
  train-megatron-split) # The headline command, split: the Megatron trainer on one GPU, SGLang on the other.
         rm -rf runs/sglang-megatron-split
         step train-megatron-split 420 python3 -c "import sys; from rlcore.cli.main import main; sys.exit(main())" train \
           --engine megatron --rollout sglang trainer.placement=split transport.name=sglang-distributed \
           trainer.total_steps=15 trainer.experiment_name=sglang-megatron-split
         cp runs/sglang-megatron-split/metrics.jsonl "$OUT/train_megatron_split_sglang.metrics.jsonl" 2>/dev/null
         tar -C runs/sglang-megatron-split -czf "$OUT/train_megatron_split_sglang_logs.tgz" logs config.yaml error.log 2>/dev/null ;;
  pack-out) pack_out ;;  # last: everything under $OUT in one archive (a call brings back at most 8 files)
  *) echo "unknown stage $stage"; exit 2 ;;
esac; done
