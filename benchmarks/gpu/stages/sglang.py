"""rlcore-sglang on the SGLang bundle: its GPU tests, the SGLang rows, and GRPO runs through SGLang.

PYTHONPATH is /tmp/proj, then /tmp/site: the bundle's transformers 5.12.1 (SGLang's pin) must shadow the
machine's 5.17.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..actions import PY, Ctx, Do, FreeGpu, Run, Unless, cmd, words
from .base import Stage

MODEL = "/tmp/rlcore-bench-gpu/qwen2-0.5B"
SAVE_MODEL = (
    "import sys, torch; sys.path.insert(0, 'benchmarks'); from pathlib import Path; from vllm_gpu import save_model; "
    f"Path('{MODEL}').mkdir(parents=True, exist_ok=True); save_model(Path('{MODEL}'), '0.5B', torch.device('cuda')); "
    "print('model ok')"
)
# `rlcore train` without its console script (pip --target puts it in /tmp/proj/bin, off PATH).
RLCORE = (PY, "-c", "import sys; from rlcore.cli.main import main; sys.exit(main())")
BENCH = "--batch 64 256 --new-tokens 256 --shape 0.5B"
TEST_ENV = {"RLCORE_SGLANG_TEST_MODEL": MODEL}


def _model(ctx: Ctx) -> list:
    return [Run("model", 120, (PY, "-c", SAVE_MODEL))]


def _with_model(actions: list) -> list:
    """The random 0.5B-shaped model first, unless an earlier stage on this machine wrote it."""
    return [Unless(f"{MODEL}/config.json", tuple(_model(Ctx()))), *actions]


def _pytest(name: str, limit: int, target: str, *extra: str):
    def build(ctx: Ctx) -> list:
        argv = cmd(PY, "-m", "pytest", target, extra, "-v", "-s", "-rA", f"--junitxml={ctx.res}/{name}.xml")
        return _with_model([Run(name, limit, argv, env=TEST_ENV, tail=40)])

    return build


def _probe(*variants: str):
    def build(ctx: Ctx) -> list:
        actions: list = []
        for v in variants:  # each in a fresh process: NCCL reads its environment once
            actions.append(
                Run(f"probe-{v}", 150, (PY, "benchmarks/gpu/sglang_dist_probe.py", MODEL, v), tail=40)
            )
            actions.append(FreeGpu())  # the probe's SGLang scheduler outlives a failed run
        return _with_model(actions)

    return build


def _bench(name: str, limit: int, args: str, out: str):
    def build(ctx: Ctx) -> list:
        return [
            Run(
                name,
                limit,
                cmd(PY, "benchmarks/sglang_gpu.py", words(args), "--out", f"{ctx.res}/{out}"),
                tail=40,
            )
        ]

    return build


def _train(
    name: str, experiment: str, overrides: str, files: str, logs: tuple[str, ...], steps: int = 15, first=()
):
    """A `steps`-step `rlcore train` through SGLang, after the actions ``first``; its metrics and logs
    copied into RES."""

    def build(ctx: Ctx) -> list:
        run_dir = Path("runs") / experiment

        def keep(ctx: Ctx) -> None:
            res = Path(ctx.res)
            if (run_dir / "metrics.jsonl").is_file():
                shutil.copyfile(run_dir / "metrics.jsonl", res / f"{files}.metrics.jsonl")
            present = [x for x in logs if (run_dir / x).exists()]
            if present:
                subprocess.run(["tar", "-C", str(run_dir), "-czf", str(res / f"{files}_logs.tgz"), *present])

        argv = cmd(
            RLCORE,
            "train",
            words(overrides),
            f"trainer.total_steps={steps}",
            f"trainer.experiment_name={experiment}",
        )
        return [
            *first,
            Do(f"rm -rf {run_dir}", lambda ctx: shutil.rmtree(run_dir, ignore_errors=True)),
            Run(name, 420, argv, tail=40),
            Do(
                f"copy {run_dir}/metrics.jsonl to {files}.metrics.jsonl, tar {' '.join(logs)} to {files}_logs.tgz",
                keep,
            ),
        ]

    return build


def _train_stage(
    name, experiment, overrides, files, seconds, gpus=1, logs=("logs", "config.yaml", "error.log")
):
    return Stage(
        name=f"sglang-{name}",
        doc=f"rlcore train {overrides}, 15 GRPO steps (the default demo: copy_word, tiny model)",
        script="core/rlcore/cli/main.py",
        seconds=seconds,
        build=_train(name, experiment, overrides, files, logs),
        bundles=("sglang",),
        gpus=gpus,
    )


#: Issue 36: the card's command with a Qwen3-MoE of Qwen3-30B-A3B's layer shape (8 layers, the demo
#: tokenizer's vocabulary: benchmarks/moe_demo_model.py) on 4 GPUs, Megatron EP=4 and one SGLang replica a GPU.
MOE_MODEL = "/tmp/rlcore-bench-gpu/moe-demo"


# bf16 (the demo's model.dtype is float32, for CPUs), and the actor's state moved off the GPUs while SGLang
# generates: in fp32 with the state kept, SGLang's KV cache (half of each GPU, its default) failed to come
# back after the first sync on 4 GPUs, and with the state moved the actor ran out of memory in step 2's
# sync on 2 (2026-11-28; docs/benchmarks.md).
def _moe_overrides(gpus: int) -> str:
    """The card's MoE command on ``gpus`` GPUs: Megatron EP=gpus, one SGLang replica a GPU."""
    return (
        f"--engine megatron --rollout sglang model.path={MOE_MODEL} model.dtype=bfloat16 actor.world_size={gpus} "
        f"megatron.expert_model_parallel_size={gpus} rollout.num_engines={gpus} "
        "trainer.release_train_in_rollout=true"
    )


MOE_FIRST = (
    Run(
        "moe-model",
        180,
        (PY, "benchmarks/moe_demo_model.py", "--layers", "8", "--out", MOE_MODEL),
        tail=2,
    ),
)


def _moe_train_stage(gpus: int, doc: str, seconds: int, rerun: bool = False) -> Stage:
    """5 GRPO steps of the card's MoE command on ``gpus`` GPUs, after building the model (``-rerun``: the
    same from a fresh model folder and run directory)."""
    key = f"{gpus}gpu" + ("-rerun" if rerun else "")
    return Stage(
        name=f"sglang-train-moe-{key}",
        doc=doc,
        script="benchmarks/moe_demo_model.py",
        seconds=seconds,
        build=_train(
            f"train-moe-{key}",
            f"sglang-moe-{key}",
            _moe_overrides(gpus),
            f"train_moe_{gpus}gpu_sglang" + ("_rerun" if rerun else ""),
            ("logs", "config.yaml", "error.log"),
            steps=5,
            first=MOE_FIRST,
        ),
        bundles=("sglang",),
        gpus=gpus,
        h200=True,
    )


STAGES = [
    Stage(
        "sglang-model",
        f"random Qwen2.5-0.5B-shaped model into {MODEL}",
        "benchmarks/vllm_gpu.py",
        60,
        _model,
        ("sglang",),
    ),
    Stage(
        "sglang-tests",
        "plugins/sglang/tests/test_engine_gpu.py on the 0.5B-shaped model (the post-sync gap rows)",
        "plugins/sglang/tests/test_engine_gpu.py",
        200,
        _pytest("tests", 330, "plugins/sglang/tests/test_engine_gpu.py"),
        ("sglang",),
    ),
    Stage(
        "sglang-tests-tiny",
        "the same GPU tests on their own tiny model",
        "plugins/sglang/tests/test_engine_gpu.py",
        200,
        lambda ctx: [
            Run(
                "tests-tiny",
                300,
                cmd(
                    PY,
                    "-m",
                    "pytest",
                    "plugins/sglang/tests/test_engine_gpu.py",
                    "-v",
                    "-s",
                    "-rA",
                    f"--junitxml={ctx.res}/tests-tiny.xml",
                ),
                tail=40,
            )
        ],
        ("sglang",),
    ),
    Stage(
        "sglang-tests-lora",
        "plugins/sglang/tests/test_lora_gpu.py: the adapter-only sync into SGLang, on the tiny model",
        "plugins/sglang/tests/test_lora_gpu.py",
        120,
        lambda ctx: [
            Run(
                "tests-lora",
                240,
                cmd(
                    PY,
                    "-m",
                    "pytest",
                    "plugins/sglang/tests/test_lora_gpu.py",
                    "-v",
                    "-s",
                    "-rA",
                    f"--junitxml={ctx.res}/tests-lora.xml",
                ),
                tail=40,
            )
        ],
        ("sglang",),
    ),
    Stage(
        "sglang-tests-multi",
        "test_multi_gpu.py: sglang-distributed from a trainer on GPU 0 into SGLang on GPU 1, and SGLang at tp_size=2",
        "plugins/sglang/tests/test_multi_gpu.py",
        420,
        _pytest("tests-multi", 420, "plugins/sglang/tests/test_multi_gpu.py"),
        ("sglang",),
        gpus=2,
    ),
    Stage(
        "sglang-tests-tp2",
        "test_multi_gpu.py -k TestTensorParallel: the contract suite and the re-sharded trainer sync at tp_size=2",
        "plugins/sglang/tests/test_multi_gpu.py",
        480,
        _pytest(
            "tests-tp2",
            540,
            "plugins/sglang/tests/test_multi_gpu.py",
            "-k",
            "TestTensorParallel",
            "--durations=0",
        ),
        ("sglang",),
        gpus=2,
    ),
    Stage(
        "sglang-probe-dist",
        "sglang_dist_probe.py: the sglang-distributed transport alone, memory saver on / off, NCCL cuMem on",
        "benchmarks/gpu/sglang_dist_probe.py",
        200,
        _probe("saver-on", "saver-off", "cumem-on"),
        ("sglang",),
        gpus=2,
    ),
    Stage(
        "sglang-probe-graphs",
        "sglang_dist_probe.py with CUDA graphs on (the fourth environment of the probe row)",
        "benchmarks/gpu/sglang_dist_probe.py",
        80,
        _probe("graphs-on"),
        ("sglang",),
        gpus=2,
    ),
    Stage(
        "sglang-bench",
        "sglang_gpu.py: throughput (3 repeats) and the colocated-sync rows for 0.5B and 1.5B",
        "benchmarks/sglang_gpu.py",
        200,
        _bench(
            "bench",
            420,
            f"{BENCH} --sync-shapes 0.5B 1.5B --bucket-mib 512 --repeats 3",
            "sglang_gpu_h100.json",
        ),
        ("sglang",),
    ),
    Stage(
        "sglang-bench-fast",
        "the same without deterministic inference, sync 0.5B only",
        "benchmarks/sglang_gpu.py",
        150,
        _bench(
            "bench-fast",
            300,
            f"{BENCH} --sync-shapes 0.5B --bucket-mib 512 --repeats 3 --no-deterministic",
            "sglang_gpu_h100_nondet.json",
        ),
        ("sglang",),
    ),
    Stage(
        "sglang-throughput",
        "sglang_gpu.py: plugin against raw SGLang, 9 interleaved repeats",
        "benchmarks/sglang_gpu.py",
        110,
        _bench("throughput", 200, f"{BENCH} --sync-shapes --repeats 9", "sglang_gpu_h100_throughput.json"),
        ("sglang",),
    ),
    Stage(
        "sglang-throughput-fast",
        "the same without deterministic inference",
        "benchmarks/sglang_gpu.py",
        150,
        _bench(
            "throughput-fast",
            220,
            f"{BENCH} --sync-shapes --repeats 9 --no-deterministic",
            "sglang_gpu_h100_throughput_nondet.json",
        ),
        ("sglang",),
    ),
    Stage(
        "sglang-throughput-r5",
        "plugin against raw SGLang, 5 interleaved repeats (the H200 re-measure after the request-id change)",
        "benchmarks/sglang_gpu.py",
        90,
        _bench("throughput-r5", 200, f"{BENCH} --sync-shapes --repeats 5", "sglang_gpu_throughput_r5.json"),
        ("sglang",),
    ),
    Stage(
        "sglang-rid-probe",
        "sglang_rid_probe.py: raw, the plugin, and the plugin without request ids, batch 256, 6 repeats",
        "benchmarks/gpu/sglang_rid_probe.py",
        150,
        lambda ctx: [
            Run(
                "sglang_rid_probe", 400, (PY, "benchmarks/gpu/sglang_rid_probe.py", "--repeats", "6"), tail=40
            )
        ],
        ("sglang",),
    ),
    _train_stage(
        "train-fsdp",
        "sglang-fsdp",
        "--engine fsdp --rollout sglang",
        "train_fsdp_sglang",
        190,
        logs=("logs", "config.yaml"),
    ),
    _train_stage(
        "train-megatron",
        "sglang-megatron",
        "--engine megatron --rollout sglang",
        "train_megatron_sglang",
        200,
    ),
    _train_stage(
        "train-megatron-tp2",
        "sglang-megatron-tp2",
        "--engine megatron --rollout sglang actor.world_size=2 megatron.tensor_model_parallel_size=2",
        "train_megatron_tp2_sglang",
        200,
        gpus=2,
    ),
    _moe_train_stage(
        4,
        f"rlcore train {_moe_overrides(4)}, 5 GRPO steps (the demo task; Qwen3-30B-A3B's layer shape, 8 layers)",
        480,
    ),
    _moe_train_stage(
        2,
        "the card's MoE command on 2 GPUs: EP=2, two SGLang replicas, 5 GRPO steps (the 8-layer shape)",
        420,
    ),
    _moe_train_stage(
        4,
        "sglang-train-moe-4gpu again, from a fresh model folder and run directory: its re-run",
        420,
        rerun=True,
    ),
    _train_stage(
        "train-split",
        "sglang-split",
        "--engine fsdp --rollout sglang trainer.placement=split transport.name=sglang-distributed",
        "train_split_sglang",
        120,
        gpus=2,
    ),
    _train_stage(
        "train-megatron-split",
        "sglang-megatron-split",
        "--engine megatron --rollout sglang trainer.placement=split transport.name=sglang-distributed",
        "train_megatron_split_sglang",
        150,
        gpus=2,
    ),
]
