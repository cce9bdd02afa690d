"""One GRPO step on one GPU the way ``rlcore train`` runs it, phase by phase, against its sum-of-parts bound.

The workload (issue 16), the same for rlcore and verl (``benchmarks/verl_grpo_step.py``): a random
Qwen2.5-0.5B- or 1.5B-shaped model (``vllm_gpu.SHAPES``, bf16 checkpoint, word-level tokenizer), prompts
of 256 random tokens (one word per token, no chat template), ``rollout.n=8``, 64 prompts per step,
responses of up to 512 tokens at temperature 1 (with random weights the end-of-sequence token is one of
151936, so nearly every response runs to 512: the mean is reported), reference model on (a KL loss),
one PPO epoch of one mini-batch. The trainer keeps fp32 weights with bf16 mixed precision and the
rollout generates in bf16 (``rollout.dtype``), as verl's defaults do; colocated: the Ray workers of actor,
reference and vLLM share the GPU, their memory released and resumed by tag around each phase.

Reported, as the median over the steps after the first (which compiles and warms up):

- ``timing/*`` phases of the controller: generate, old log-probs (skipped on-policy), reference
  log-probs, advantages, update, weight sync (and inside them release/resume), and the controller's own
  time (step minus the phases);
- step seconds, tokens per second per GPU (prompt + response tokens of the step over its time), the
  GPU's peak memory in use (``nvidia-smi``, every process on the card);
- the sum-of-parts bound: raw ``vllm.LLM.generate`` of the same requests (own process, CUDA graphs,
  ``ignore_eos``), plus the update and the reference forward at the FSDP engine's measured MFU
  (``--mfu``, from its own benchmark rows) on the step's real tokens (FLOPs as in ``_workload.py``),
  plus the weight copy floor.

    python benchmarks/grpo_step_gpu.py --shape 0.5B --steps 4 --out /tmp/out/grpo_step [--verl DIR]

``--verl DIR`` reads ``DIR/verl_metrics.json`` (``benchmarks/verl_grpo_step.py``) into the comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPT_LEN, RESPONSE_LEN, N, PROMPTS = 256, 512, 8, 64
PEAK_FLOPS = 989e12  # H100 SXM dense bf16
#: The FSDP engine's measured MFU on one H100 (docs/benchmarks.md: fsdp-tokens-per-s-0.5b-h100 28.8%,
#: fsdp-mfu-1.5b-h100 46.9%), what the bound assumes training runs at.
MFU = {"0.5B": 0.288, "1.5B": 0.469}
PHASES = (
    "generate",
    "score",
    "old_log_probs",
    "ref_log_probs",
    "advantages",
    "update_actor",
    "sync_weights",
)

REWARD = '''"""Cheap rule reward: the share of even token words in the response."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    words = solution_str.split()
    return sum(w[1:].isdigit() and int(w[1:]) % 2 == 0 for w in words) / len(words) if words else 0.0
'''


def write_inputs(out: Path, shape: str, steps: int) -> dict:
    """The model folder, the prompt file (verl's row schema; ``prompt`` as plain text) and the reward."""
    import torch
    from vllm_gpu import VOCAB, save_model, word_level_tokenizer

    model = out / f"qwen2-{shape}"
    model.mkdir(parents=True, exist_ok=True)
    save_model(model, shape, torch.device("cuda"))
    # The tokenizer again in a folder of its own: beside a Qwen2 config, transformers 5 loads any
    # tokenizer as its Qwen2Tokenizer (byte-level BPE), which encodes the words "t17 t300" to nothing.
    tokenizer = out / "tokenizer"
    if not (tokenizer / "tokenizer.json").exists():
        word_level_tokenizer().save_pretrained(str(tokenizer))
    rng = random.Random(0)
    rows = [
        {
            "data_source": "synthetic",
            "prompt": " ".join(f"t{rng.randrange(VOCAB - 2)}" for _ in range(PROMPT_LEN)),
            "reward_model": {"style": "rule", "ground_truth": ""},
        }
        for _ in range(PROMPTS * (steps + 1))
    ]
    data = out / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reward = out / "reward.py"
    reward.write_text(REWARD)
    return {"model": model, "tokenizer": tokenizer, "data": data, "reward": reward}


#: The settings this benchmark has always named beside its workload (the trainer's precision, packing,
#: the rollout's dtype, memory share and placement). ``--defaults`` leaves them out, so ``rlcore train``
#: decides them itself, as a user's run does.
SETTINGS = (
    "model.dtype=float32",
    "fsdp.mixed_precision=bfloat16",
    "fsdp.use_remove_padding=true",
    "fsdp.attn_implementation=varlen",
    "rollout.dtype=bfloat16",
    "rollout.gpu_memory_utilization=0.5",
    "trainer.placement=colocated",
)


def rlcore_command(
    inputs: dict,
    steps: int,
    out: Path,
    extra: list[str],
    name: str = "grpo_step",
    *,
    prompts: int = PROMPTS,
    response_len: int = RESPONSE_LEN,
    defaults: bool = False,
) -> list[str]:
    """``rlcore train`` on this workload into ``out/runs/name``; ``extra`` overrides come last (and win).
    ``defaults``: the workload alone, without :data:`SETTINGS`. ``benchmarks/async_gpu.py`` runs the same
    workload at other sizes."""
    # The console script's own code: the GPU machine installs with --target, which leaves no script on PATH.
    launcher = [sys.executable, "-c", "import sys; from rlcore.cli.main import main; sys.exit(main())"]
    return [
        *launcher,
        "train",
        "--engine",
        "fsdp",
        "--rollout",
        "vllm",
        f"model.path={inputs['model']}",
        f"model.tokenizer_path={inputs['tokenizer']}",
        *(() if defaults else SETTINGS),
        f"data.train_files=[{inputs['data']}]",
        "data.val_files=[]",
        "data.apply_chat_template=false",
        f"data.max_prompt_length={PROMPT_LEN}",
        f"data.train_batch_size={prompts}",
        f"rollout.n={N}",
        f"rollout.max_response_length={response_len}",
        "rollout.temperature=1.0",
        "algorithm.name=grpo",
        "algorithm.use_kl_loss=true",
        "algorithm.kl_loss_coef=0.001",
        "actor.ppo_epochs=1",
        f"actor.ppo_mini_batch_size={prompts}",
        "actor.optim.lr=1e-6",
        f"trainer.total_steps={steps}",
        "trainer.warmup_sft_steps=0",
        "trainer.val_before_train=false",
        "trainer.val_freq=0",
        "trainer.loggers=[console,jsonl]",
        f"trainer.output_dir={out / 'runs'}",
        f"trainer.experiment_name={name}",
        "trainer.resume=disable",  # a second run of the same name starts afresh, not from the first's end
        f"reward.custom_function_path={inputs['reward']}",
        *extra,
    ]


class PeakMemory:
    """The GPU's memory in use (every process), polled with ``nvidia-smi`` every ``interval`` s."""

    def __init__(self, interval: float = 0.5):
        self.peak_mib, self.interval = 0.0, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                used = subprocess.run(
                    ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout.split()
                self.peak_mib = max(self.peak_mib, float(used[0]))
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                pass

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _steps_done(metrics: Path) -> int:
    if not metrics.is_file():
        return 0
    return sum('"timing/step"' in line for line in metrics.read_text().splitlines())


def run_rlcore(
    inputs: dict,
    steps: int,
    out: Path,
    timeout: float,
    extra: list[str],
    name: str,
    *,
    defaults: bool = False,
    stop_after: int = 0,
) -> dict:
    """The run, its wall time, the card's peak memory and its step records. ``stop_after``: end the run
    (SIGINT, as Ctrl-C would) once that many steps are recorded, so a run of the default length is timed
    on its first steps without running them all."""
    command = rlcore_command(inputs, steps, out, extra, name, defaults=defaults)
    log = out / f"{name}_train.log"
    metrics = out / "runs" / name / "metrics.jsonl"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    stopped = killed = None
    with PeakMemory() as memory, log.open("w") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            while proc.poll() is None:
                now = time.perf_counter()
                if now - started > timeout:
                    raise subprocess.TimeoutExpired(command, timeout)
                if stop_after and stopped is None and _steps_done(metrics) >= stop_after:
                    proc.send_signal(signal.SIGINT)
                    stopped = now
                if stopped is not None and now - stopped > 90:  # it did not wind down by itself
                    killed = True
                    break
                time.sleep(1.0)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if killed:  # its Ray cluster may outlive it, and the next run would join that one
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0 and stopped is None:
        tail = log.read_text().splitlines()[-40:]
        raise SystemExit(f"rlcore train failed ({proc.returncode}):\n" + "\n".join(tail))
    records = [json.loads(line) for line in metrics.open()]
    steps_ = [r for r in records if "timing/step" in r]
    return {
        "command": " ".join(map(str, command)),
        "wall_s": wall,
        "peak_gpu_memory_gib": memory.peak_mib / 1024,
        "stopped_after": len(steps_) if stopped is not None else None,
        "killed_after_stop": bool(killed),
        "steps": steps_,
    }


def hold_gpu_memory(gib: float) -> subprocess.Popen:
    """Another process that holds ``gib`` GiB of the GPU until it is ended: a smaller card's free memory
    on a large one (``--hold-gib``)."""
    code = (
        "import sys, time, torch; "
        f"x = torch.empty({int(gib * 2**30)}, dtype=torch.uint8, device='cuda'); "
        "print('held', flush=True); time.sleep(1e6)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "held":
        raise SystemExit(f"could not hold {gib} GiB of the GPU")
    return proc


def controller_seconds(step: dict) -> float:
    """One step's time outside its phases and release/resume: the driver's own work (dispatch, batch
    assembly, metrics) and waiting between phases. Never negative: a step's phases run inside it."""
    inside = sum(step.get(f"timing/{p}", 0.0) for p in PHASES) + step.get("timing/release_resume", 0.0)
    return max(0.0, step["timing/step"] - inside)


def summarize(steps: list[dict], profiled: int = 0, gpus: int = 1) -> dict:
    """Medians over the steps after the first, the profiled one left out. ``gpus``: devices the run
    used (:func:`gpus_used`), which ``tokens_per_s_per_gpu`` divides by.

    ``controller_s`` is the median of each step's own remainder (:func:`controller_seconds`): a step
    minus the medians of its phases mixes different steps and came out negative."""
    timed = [s for s in steps[1:] if s["step"] != profiled] or steps

    def med(key: str) -> float | None:
        values = [s[key] for s in timed if key in s]
        return statistics.median(values) if values else None

    phases = {p: med(f"timing/{p}") for p in PHASES}
    step = med("timing/step")
    out = {
        "step_s": step,
        "step_range_s": [min(s["timing/step"] for s in timed), max(s["timing/step"] for s in timed)],
        "phases_s": {k: v for k, v in phases.items() if v is not None},
        "release_resume_s": med("timing/release_resume"),
        "controller_s": statistics.median(controller_seconds(s) for s in timed),
        "tokens_per_step": med("tokens/total"),
        "response_length_mean": med("response_length/mean"),
        "sync_s": med("sync/seconds"),
        "reward_mean_by_step": [s.get("reward/mean") for s in steps],
        "steps_timed": len(timed),
        "gpus": gpus,
    }
    out["tokens_per_s"] = out["tokens_per_step"] / step
    out["tokens_per_s_per_gpu"] = out["tokens_per_s"] / gpus
    return out


def gpus_used(run_dir: Path, roles: tuple[str, ...] = ("actor", "rollout")) -> int:
    """Devices the run in ``run_dir`` held: its resolved ``config.yaml`` through rlcore's own placement
    rule (colocated roles share devices, split ones do not, a hybrid rollout lives in the actor's)."""
    from rlcore.cluster.placement import plan_placement, role_sizes_from_config
    from rlcore.config import load_config

    config = load_config(run_dir / "config.yaml")
    placement = plan_placement(
        config.trainer.placement,
        role_sizes_from_config(config, roles),
        resource="GPU",
        rollout_tensor_parallel=config.rollout.tensor_parallel_size,
    )
    return sum(pool.num_bundles for pool in placement.pools.values())


def raw_generate_child(model: str, repeats: int, result: Path) -> None:
    """Raw vLLM on the same requests (``--raw-generate``, its own process)."""
    import vllm

    llm = vllm.LLM(
        model=model,
        dtype="bfloat16",
        max_model_len=PROMPT_LEN + RESPONSE_LEN,
        gpu_memory_utilization=0.5,
        seed=0,
    )
    rng = random.Random(0)
    prompts = [
        {"prompt_token_ids": [rng.randrange(151934) for _ in range(PROMPT_LEN)]} for _ in range(PROMPTS)
    ]
    params = vllm.SamplingParams(
        n=N, temperature=1.0, max_tokens=RESPONSE_LEN, ignore_eos=True, logprobs=0, seed=None
    )
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    result.write_text(
        json.dumps({"seconds": statistics.median(times[1:]), "runs_s": times[1:], "tokens": tokens})
    )


def bound(shape: str, raw_generate_s: float, tokens_per_seq: list[int], mfu: float) -> dict:
    """Raw generation + the update and the reference forward at ``mfu`` + the weight copy floor."""
    from _workload import matmul_params, step_flops
    from vllm_gpu import COPY_FLOOR_BYTES_PER_S, qwen2_config

    config = qwen2_config(shape)
    update_flops = step_flops(config, tokens_per_seq)  # forward + backward
    ref_flops = update_flops / 3  # a forward
    train_s = (update_flops + ref_flops) / (mfu * PEAK_FLOPS)
    copy_s = 2 * sum_params(config) / COPY_FLOOR_BYTES_PER_S  # bf16 weights
    return {
        "generate_s": raw_generate_s,
        "train_s": train_s,
        "update_s": update_flops / (mfu * PEAK_FLOPS),
        "ref_s": ref_flops / (mfu * PEAK_FLOPS),
        "copy_floor_s": copy_s,
        "total_s": raw_generate_s + train_s + copy_s,
        "mfu": mfu,
        "matmul_params": matmul_params(config),
    }


def sum_params(config) -> int:
    """Every parameter of the model (the embedding once when tied)."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="0.5B", choices=sorted(MFU))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mfu", type=float, help="training MFU the bound assumes (default: measured rows)")
    parser.add_argument("--raw-repeats", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=540)
    parser.add_argument("--verl", type=Path, help="folder of benchmarks/verl_grpo_step.py's results")
    parser.add_argument("--skip-rlcore", action="store_true")
    parser.add_argument(
        "--profile-step",
        type=int,
        default=0,
        help="profile this step in every worker (left out of the medians)",
    )
    parser.add_argument(
        "--name",
        default="grpo_step",
        help="run name: results in NAME_SHAPE.json (a variant beside the default)",
    )
    parser.add_argument("--skip-raw", action="store_true")
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="the workload alone: rlcore decides precision, packing, rollout dtype and placement itself",
    )
    parser.add_argument(
        "--total-steps",
        type=int,
        help="trainer.total_steps of the run (default --steps); with --steps below it, the run is stopped "
        "after --steps steps",
    )
    parser.add_argument(
        "--hold-gib",
        type=float,
        default=0.0,
        help="another process holds this much GPU memory during the run (a smaller card on a large one); "
        "the peak reported is the run's, without it",
    )
    parser.add_argument("--raw-generate", nargs=2, metavar=("MODEL", "RESULT"), help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="more rlcore key=value overrides")
    args = parser.parse_args()
    if args.raw_generate:
        raw_generate_child(args.raw_generate[0], args.raw_repeats, Path(args.raw_generate[1]))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    inputs = write_inputs(args.out, args.shape, args.steps)
    result_path = args.out / f"{args.name}_{args.shape}.json"
    result: dict = json.loads(result_path.read_text()) if result_path.exists() else {}
    result.update(
        shape=args.shape, workload=dict(prompt=PROMPT_LEN, response=RESPONSE_LEN, n=N, prompts=PROMPTS)
    )

    def save() -> None:
        result_path.write_text(json.dumps(result, indent=2))

    if not args.skip_raw:
        raw = args.out / "raw_generate.json"
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--raw-generate",
                str(inputs["model"]),
                str(raw),
                "--raw-repeats",
                str(args.raw_repeats),
                "--out",
                str(args.out),
            ],
            check=True,
            timeout=args.timeout,
        )
        result["raw_generate"] = json.loads(raw.read_text())
        save()
    if not args.skip_rlcore:
        extra = [*args.overrides, f"trainer.profile_step={args.profile_step}"]
        total = args.total_steps or args.steps
        holder = hold_gpu_memory(args.hold_gib) if args.hold_gib else None
        try:
            run = run_rlcore(
                inputs,
                total,
                args.out,
                args.timeout,
                extra,
                args.name,
                defaults=args.defaults,
                stop_after=args.steps if total > args.steps else 0,
            )
        finally:
            if holder is not None:
                holder.kill()
                holder.wait()
        run["held_gib"] = args.hold_gib
        run["peak_gpu_memory_gib"] -= args.hold_gib
        gpus = gpus_used(args.out / "runs" / args.name)
        result["rlcore"] = {
            **{k: v for k, v in run.items() if k != "steps"},
            **summarize(run["steps"], args.profile_step, gpus),
            "profile_step": args.profile_step,
        }
        result["rlcore_steps"] = run["steps"]
        save()
    if "raw_generate" in result and "rlcore" in result:
        per_seq = PROMPT_LEN + result["rlcore"]["response_length_mean"]
        lengths = [round(per_seq)] * (PROMPTS * N)
        result["bound"] = bound(
            args.shape, result["raw_generate"]["seconds"], lengths, args.mfu or MFU[args.shape]
        )
        result["rlcore_over_bound"] = result["rlcore"]["step_s"] / result["bound"]["total_s"]
    if args.verl is not None and (args.verl / "verl_metrics.json").exists():
        verl = json.loads((args.verl / "verl_metrics.json").read_text())
        result["verl"] = verl
        steps = verl.get("steps", verl) if isinstance(verl, dict) else verl
        timed = steps[1:] or steps
        if timed and "timing_s/step" in timed[0]:
            keys = sorted({k for s in timed for k in s if k.startswith(("timing_s/", "perf/"))})
            result["verl_summary"] = {
                k: statistics.median(s[k] for s in timed if isinstance(s.get(k), (int, float))) for k in keys
            }
            memory = args.verl / "gpu_memory.csv"  # nvidia-smi -lms 500 during the step-* stages
            if memory.exists():
                used = [float(x) for x in memory.read_text().split() if x.replace(".", "").isdigit()]
                result["verl_summary"]["peak_gpu_memory_gib"] = max(used) / 1024 if used else None
            verl_step = statistics.median(s["timing_s/step"] for s in timed)
            result["verl_step_s"] = verl_step
            result["verl_step_range_s"] = [
                min(s["timing_s/step"] for s in timed),
                max(s["timing_s/step"] for s in timed),
            ]
            if "rlcore" in result:
                result["rlcore_over_verl"] = result["rlcore"]["step_s"] / verl_step
    save()
    print(json.dumps({k: v for k, v in result.items() if k not in ("rlcore_steps", "verl")}, indent=2))


if __name__ == "__main__":
    main()
