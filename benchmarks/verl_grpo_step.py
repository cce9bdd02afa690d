"""verl's GRPO trainer on the same model and data as rlcore's GPU benchmarks: one step's time, phase by phase.

Runs ``python -m verl.trainer.main_ppo`` (verl 0.9.1, from the bundle ``python -m benchmarks.gpu bundle verl`` builds)
on one GPU: GRPO, FSDP2 actor and reference (KL loss on), vLLM rollout (verl's only mode in 0.9: ``async``,
an AsyncLLM server per replica driven by the agent loop, weights synced by the colocated ``naive``
checkpoint engine), ``--prompts`` prompts of exactly ``--prompt-len`` random word tokens, ``--n`` responses
each of exactly ``--response-len`` tokens (EOS ignored), temperature 1, one PPO epoch of one mini-batch per
step, a cheap rule reward. Per-step metrics (``timing_s/*``, ``perf/*``, rewards ...) go to
``OUT/verl_metrics.json`` with the exact command line (also ``OUT/verl_command.txt``), verl's output to
``OUT/verl.log``; the data, tokenizer copy and reward file to ``--work`` (default ``OUT/work``).

    python benchmarks/verl_grpo_step.py --model DIR --out OUT [--work DIR] [--steps 4] [--prompts 64] [--n 8]
    python benchmarks/verl_grpo_step.py --model DIR --out OUT --dry-run       # data + files + command only
    python benchmarks/verl_grpo_step.py --model DIR --out OUT --print-config  # hydra composition only

``--model`` is a model directory written by rlcore's benchmarks (``benchmarks/vllm_gpu.py``: a random
Qwen2 and a word-level tokenizer ``t0 .. t151933``, ``<|bos|>``, ``<|eos|>``); with ``--shape`` (0.5B,
1.5B, smoke) a missing one is written first. The tokenizer has no chat template, so verl gets a copy of the
tokenizer files alone (``model.tokenizer_path``) whose template is the messages' contents, concatenated: a
prompt of ``--prompt-len`` words is exactly ``--prompt-len`` tokens, nothing added.

Choices, verl's defaults unless said: ``model_engine=dp`` (FSDP engine workers), ``strategy=fsdp2`` for
actor and ref; attention ``sdpa`` with ``use_remove_padding=False`` (verl's default loads
``flash_attention_2``, which needs the flash-attn package the GPU machine lacks; every sequence here is
exactly prompt + response long, so there is no padding to remove); gradient checkpointing off; dynamic
batch size on with ``--max-token-len`` (16384) tokens per micro-batch for the update and
``--logprob-max-token-len`` (32768) for the old/ref log-prob passes; ``trainer.use_v1=True`` (the V1
``sync`` trainer, verl 0.9's default; ``--legacy-trainer`` selects ``RayPPOTrainer``); Ray told of
``--ray-num-cpus`` (32) logical CPUs: verl's actors that reserve a CPU each (TransferQueue's controller and 8
storage units, the trainer's placement group of 3) would otherwise wait forever on a small host. Left at
verl's defaults: fp32 master weights with bf16 compute (``fsdp_config.model_dtype``), torch.compile'd
log-prob code, vLLM with CUDA graphs, sleep mode between rollouts and its tokenizer from ``--model`` (as
rlcore's vLLM engine), the rule reward computed by verl's reward workers while the rollout runs (in ``gen``).

A small module on ``PYTHONPATH`` (``VERL_USE_EXTERNAL_MODULES``) maps ``model_type`` qwen2 to verl's
``default`` Continuous Token builder: the Qwen one needs a ChatML tokenizer (``"\\n"`` as one token,
``<|im_end|>``), which the word-level one is not. It only changes how the prompt's token ids are built.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
DATA_SOURCE = "rlcore_bench_words"
# The phases of one verl step, in the order they run (V1 ``sync`` trainer; the legacy one names them alike).
PHASES = (
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/adv",
    "timing_s/update_actor",
    "timing_s/update_weights",
    "timing_s/step",
)
SUMMARY_KEYS = PHASES + (
    "perf/throughput",
    "perf/total_num_tokens",
    "perf/time_per_step",
    "perf/max_memory_allocated_gb",
    "perf/max_memory_reserved_gb",
    "critic/score/mean",
    "critic/rewards/mean",
    "response_length/mean",
    "response_length/clip_ratio",
    "prompt_length/mean",
    "actor/kl_loss",
    "actor/pg_loss",
)

REWARD_SOURCE = '''"""Cheap rule reward for verl's benchmark run: the fraction of response words ``tN`` with N even."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    words = solution_str.split()
    if not words:
        return 0.0
    even = sum(1 for w in words if w[1:].isdigit() and int(w[1:]) % 2 == 0)
    return even / len(words)
'''

PATCH_SOURCE = '''"""Imported by verl in every process (VERL_USE_EXTERNAL_MODULES): word-level tokenizer, not ChatML."""

from verl.utils.tokenizer import continuous_token_wiring as _wiring

_wiring._MODEL_TYPE_TO_FAMILY["qwen2"] = _wiring.ContinuousTokenModelFamily.DEFAULT
'''


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="HF model dir (rlcore's benchmark model)")
    p.add_argument("--shape", choices=("0.5B", "1.5B", "smoke"), help="write --model first if missing")
    p.add_argument("--out", required=True, help="output dir (log, metrics, command, config)")
    p.add_argument("--work", help="dir for the data, tokenizer copy, reward file, caches (default OUT/work)")
    p.add_argument("--prompts", type=int, default=64, help="prompts per step (= PPO mini-batch)")
    p.add_argument(
        "--prompts-file",
        help="jsonl of rows with a plain-text 'prompt' (grpo_step_gpu.py's prompts.jsonl): train on exactly "
        "rlcore's prompts, in order, instead of fresh random ones",
    )
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=512)
    p.add_argument("--n", type=int, default=8, help="responses per prompt (GRPO group)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--kl-coef", type=float, default=0.001)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--max-num-seqs", type=int, default=256, help="vLLM max_num_seqs (verl's default)")
    p.add_argument("--max-token-len", type=int, default=16384, help="tokens per update micro-batch")
    p.add_argument("--logprob-max-token-len", type=int, default=32768, help="tokens per log-prob micro-batch")
    p.add_argument("--attn", default="sdpa", help="HF attn_implementation of the FSDP actor and ref")
    p.add_argument("--remove-padding", action="store_true", help="use_remove_padding=True")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs")
    p.add_argument("--legacy-trainer", action="store_true", help="trainer.use_v1=False (RayPPOTrainer)")
    p.add_argument("--seed", type=int, default=0, help="data seed")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before verl is stopped")
    p.add_argument(
        "--exit-grace", type=float, default=60.0, help="seconds verl may take to exit after its last step"
    )
    p.add_argument("--ray-num-cpus", type=int, default=32, help="logical CPUs Ray schedules on (see below)")
    p.add_argument("--extra", action="append", default=[], help="one more hydra override (repeatable)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="write data and files, print the command")
    mode.add_argument("--print-config", action="store_true", help="hydra composition only (--cfg job)")
    return p.parse_args(argv)


def ensure_model(args) -> Path:
    model = Path(args.model).resolve()
    if not (model / "config.json").exists():
        if not args.shape:
            sys.exit(f"{model} has no config.json (give --shape to write one)")
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import torch
        from vllm_gpu import save_model

        model.mkdir(parents=True, exist_ok=True)
        save_model(model, args.shape, torch.device("cpu"))
    return model


def tokenizer_dir(model: Path, work: Path) -> Path:
    """``work/tokenizer``: ``model``'s tokenizer files with the trivial chat template, and no ``config.json``.

    Without a model config beside it, ``AutoTokenizer`` keeps the word-level tokenizer the files describe:
    next to a qwen2 ``config.json``, transformers 5 swaps in its ``Qwen2Tokenizer`` (a byte-level BPE that
    turns ``t5 t7`` into no ids at all).
    """
    tok = work / "tokenizer"
    tok.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "special_tokens_map.json", "added_tokens.json"):
        if (model / name).exists():
            (tok / name).write_bytes((model / name).read_bytes())
    tok_cfg_path = model / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text()) if tok_cfg_path.exists() else {}
    tok_cfg["chat_template"] = CHAT_TEMPLATE
    (tok / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    (tok / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return tok


def word_vocab(model: Path) -> int:
    """How many ``tN`` words the tokenizer has: every id but ``<|bos|>`` and ``<|eos|>``."""
    return int(json.loads((model / "config.json").read_text())["vocab_size"]) - 2


def write_data(
    work: Path, rows: int, prompt_len: int, words: int, seed: int, split: str, texts: list[str] | None = None
) -> Path:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if texts is None:
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, words, size=(rows, prompt_len))
        texts = [" ".join(f"t{i}" for i in row) for row in ids.tolist()]
    records = [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": text}],
            "ability": "bench",
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"split": split, "index": k},
        }
        for k, text in enumerate(texts[:rows])
    ]
    path = work / "data" / f"{split}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def overrides(args, model: Path, tokenizer: Path, train: Path, val: Path, reward: Path) -> list[str]:
    total = args.prompt_len + args.response_len
    arr = "actor_rollout_ref"
    o = [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"data.train_batch_size={args.prompts}",
        f"data.max_prompt_length={args.prompt_len}",
        f"data.max_response_length={args.response_len}",
        "data.filter_overlong_prompts=False",
        "data.truncation=error",
        f"data.seed={args.seed}",
        f"{arr}.model.path={model}",
        f"{arr}.model.tokenizer_path={tokenizer}",
        f"{arr}.model.use_remove_padding={args.remove_padding}",
        f"{arr}.model.enable_gradient_checkpointing={args.gradient_checkpointing}",
        f"+{arr}.model.override_config.attn_implementation={args.attn}",
        f"{arr}.actor.strategy=fsdp2",
        f"{arr}.ref.strategy=fsdp2",
        f"{arr}.actor.optim.lr={args.lr}",
        f"{arr}.actor.ppo_mini_batch_size={args.prompts}",
        f"{arr}.actor.ppo_epochs=1",
        f"{arr}.actor.use_dynamic_bsz=True",
        f"{arr}.actor.ppo_max_token_len_per_gpu={max(args.max_token_len, total)}",
        f"{arr}.actor.use_kl_loss=True",
        f"{arr}.actor.kl_loss_coef={args.kl_coef}",
        f"{arr}.actor.kl_loss_type=low_var_kl",
        f"{arr}.actor.entropy_coeff=0",
        f"{arr}.ref.log_prob_use_dynamic_bsz=True",
        f"{arr}.ref.log_prob_max_token_len_per_gpu={max(args.logprob_max_token_len, total)}",
        f"{arr}.rollout.log_prob_use_dynamic_bsz=True",
        f"{arr}.rollout.log_prob_max_token_len_per_gpu={max(args.logprob_max_token_len, total)}",
        f"{arr}.rollout.name=vllm",
        f"{arr}.rollout.mode=async",
        f"{arr}.rollout.n={args.n}",
        f"{arr}.rollout.temperature=1.0",
        f"{arr}.rollout.top_p=1.0",
        f"{arr}.rollout.top_k=-1",
        f"{arr}.rollout.ignore_eos=True",
        f"{arr}.rollout.dtype=bfloat16",
        f"{arr}.rollout.tensor_model_parallel_size=1",
        f"{arr}.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        f"{arr}.rollout.max_num_seqs={args.max_num_seqs}",
        f"{arr}.rollout.max_model_len={total}",
        f"{arr}.rollout.enforce_eager={args.enforce_eager}",
        f"{arr}.rollout.free_cache_engine=True",
        "reward.custom_reward_function.path=" + str(reward),
        "reward.custom_reward_function.name=compute_score",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        "trainer.logger=[console,file]",
        "trainer.project_name=rlcore_bench",
        "trainer.experiment_name=verl_grpo_step",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        f"trainer.total_training_steps={args.steps}",
        "trainer.total_epochs=1",
        f"trainer.default_local_dir={args.work_dir / 'checkpoints'}",
        f"trainer.use_v1={not args.legacy_trainer}",
        f"ray_kwargs.ray_init.num_cpus={args.ray_num_cpus}",
        f"hydra.run.dir={args.work_dir / 'hydra'}",
    ]
    return o + list(args.extra)


def run_env(out: Path, work: Path, ext: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ext), env.get("PYTHONPATH", "")) if p)
    env["VERL_USE_EXTERNAL_MODULES"] = "verl_bench_patch"
    env["VERL_FILE_LOGGER_PATH"] = str(out / "verl_metrics.jsonl")
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("HF_DATASETS_CACHE", str(work / "hf_datasets"))
    env.setdefault("HYDRA_FULL_ERROR", "1")
    env.setdefault("RAY_DEDUP_LOGS", "0")
    env.setdefault("TOKENIZERS_PARALLELISM", "true")
    return env


_CONSOLE = re.compile(r"step:(\d+) - (.*)$")


def parse_console(text: str) -> dict[int, dict]:
    """verl's console logger: ``step:N - key:value - key:value ...`` (numbers only)."""
    steps: dict[int, dict] = {}
    for line in text.splitlines():
        m = _CONSOLE.search(line)
        if not m:
            continue
        row = {}
        for item in m.group(2).split(" - "):
            key, sep, value = item.partition(":")
            if not sep:
                continue
            try:
                row[key.strip()] = float(value)
            except ValueError:
                continue
        if row:
            steps[int(m.group(1))] = row
    return steps


def parse_jsonl(path: Path) -> dict[int, dict]:
    steps: dict[int, dict] = {}
    if not path.exists():
        return steps
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        data = {k: v for k, v in rec.get("data", {}).items() if isinstance(v, (int, float))}
        steps[int(rec["step"])] = data
    return steps


def _stop(proc: subprocess.Popen) -> None:
    """End verl's process group (Ray's own processes end with their driver)."""
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue


def run_verl(
    cmd: list[str], env: dict, log: Path, jsonl: Path, steps: int, timeout: float, exit_grace: float
):
    """Run verl in its own process group, its output to the console and ``log``.

    Stopped at ``timeout``, or ``exit_grace`` seconds after its last step was logged if it has not exited by then.
    Returns (return code, timed out, stopped after its last step).
    """
    start = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:  # each line stamped with seconds since the launch (where start-up goes)
                fh.write(f"[{time.monotonic() - start:7.1f}s] {line}")
                fh.flush()
                sys.stdout.write(line)
                sys.stdout.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = lingered = False
        done_at = None
        try:
            while proc.poll() is None:
                time.sleep(2)
                now = time.monotonic()
                if done_at is None and len(parse_jsonl(jsonl)) >= steps:
                    done_at = now
                if now - start > timeout:
                    timed_out = True
                    break
                if done_at is not None and now - done_at > exit_grace:
                    lingered = True
                    break
        finally:
            _stop(proc)
            reader.join(timeout=10)
    rc = proc.returncode if proc.returncode is not None else -9
    return (0 if lingered else rc), timed_out, lingered


def summarize(steps: list[dict]) -> str:
    keys = [k for k in SUMMARY_KEYS if any(k in s for s in steps)]
    width = max((len(k) for k in keys), default=10)
    lines = [f"{'metric':<{width}} " + " ".join(f"{'step ' + str(s['step']):>12}" for s in steps)]
    for k in keys:
        cells = []
        for s in steps:
            v = s.get(k)
            cells.append(f"{v:12.4g}" if isinstance(v, (int, float)) and math.isfinite(v) else f"{'-':>12}")
        lines.append(f"{k:<{width}} " + " ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve() if args.work else out / "work"
    work.mkdir(parents=True, exist_ok=True)
    args.work_dir = work
    model = ensure_model(args)
    tokenizer = tokenizer_dir(model, work)
    words = word_vocab(model)
    texts = None
    if args.prompts_file:
        texts = [
            json.loads(line)["prompt"] for line in Path(args.prompts_file).read_text().splitlines() if line
        ]
    train = write_data(work, args.prompts * args.steps, args.prompt_len, words, args.seed, "train", texts)
    val = write_data(work, args.prompts, args.prompt_len, words, args.seed + 1, "test")
    ext = work / "verl_ext"
    ext.mkdir(exist_ok=True)
    reward = ext / "verl_bench_reward.py"
    reward.write_text(REWARD_SOURCE)
    (ext / "verl_bench_patch.py").write_text(PATCH_SOURCE)

    cmd = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        *overrides(args, model, tokenizer, train, val, reward),
    ]
    env = run_env(out, work, ext)
    shown = "VERL_USE_EXTERNAL_MODULES=verl_bench_patch PYTHONPATH=" + shlex.quote(env["PYTHONPATH"])
    command = shown + " " + shlex.join(cmd)
    (out / "verl_command.txt").write_text(command + "\n")

    if args.dry_run:
        print(command)
        return 0
    if args.print_config:
        proc = subprocess.run(cmd + ["--cfg", "job"], env=env, capture_output=True, text=True)
        (out / "verl_config.yaml").write_text(proc.stdout)
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-8000:])
        return proc.returncode

    jsonl = out / "verl_metrics.jsonl"
    if jsonl.exists():
        jsonl.unlink()
    log = out / "verl.log"
    started = time.time()
    rc, timed_out, lingered = run_verl(cmd, env, log, jsonl, args.steps, args.timeout, args.exit_grace)
    wall = time.time() - started
    text = log.read_text(errors="replace")
    per_step = parse_jsonl(jsonl) or parse_console(text)
    steps = [{"step": k, **per_step[k]} for k in sorted(per_step)]
    result = {
        "command": command,
        "argv": cmd,
        "returncode": rc,
        "timed_out": timed_out,
        "stopped_after_last_step": lingered,
        "wall_s": wall,
        "settings": {
            k: getattr(args, k)
            for k in (
                "prompts",
                "prompt_len",
                "response_len",
                "n",
                "steps",
                "lr",
                "kl_coef",
                "gpu_memory_utilization",
                "max_num_seqs",
                "max_token_len",
                "logprob_max_token_len",
                "attn",
                "remove_padding",
                "gradient_checkpointing",
                "enforce_eager",
                "legacy_trainer",
                "ray_num_cpus",
            )
        },
        "model": str(model),
        "steps": steps,
        # Seconds from the launch to each step's log line: the first one's is start-up plus step 1.
        "step_logged_at_s": {
            int(m.group(2)): float(m.group(1))
            for m in re.finditer(r"^\[\s*([\d.]+)s\].*?step:(\d+) - ", text, re.MULTILINE)
        },
    }
    (out / "verl_metrics.json").write_text(json.dumps(result, indent=2))
    if steps:
        print(summarize(steps))
    if rc != 0 or timed_out or len(steps) < args.steps:
        tail = "\n".join(text.splitlines()[-80:])
        sys.stderr.write(
            f"\nverl failed (rc={rc}, timed_out={timed_out}, {len(steps)}/{args.steps} steps logged); "
            f"log tail ({log}):\n{tail}\n"
        )
        return rc or 1
    print(f"verl: {len(steps)} steps in {wall:.0f} s; metrics in {out / 'verl_metrics.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
