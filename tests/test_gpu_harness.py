"""The GPU harness (``python -m benchmarks.gpu``) on the CPU: its declared stages, the device calls it plans,
its bundle and results plumbing, and the docs that quote it.

Nothing here touches a GPU; what runs there is checked down to the files each stage names and the calls a
developer makes, so that a renamed script or a stage missing from the docs fails here first.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu import bundles, device, plan, results  # noqa: E402
from benchmarks.gpu.__main__ import describe  # noqa: E402
from benchmarks.gpu.actions import Ctx, Parallel, Run, Unless  # noqa: E402
from benchmarks.gpu.stages import STAGES  # noqa: E402

README = ROOT / "benchmarks" / "gpu" / "README.md"
DOCS = ROOT / "docs" / "benchmarks.md"
#: The shell scripts the harness replaced: nothing may send a reader to them.
DELETED = (
    "bundle_lib.sh",
    "call_lib.sh",
    "engines_h100.sh",
    "fa4_bundle.sh",
    "fsdp_h100.sh",
    "megatron_bundle.sh",
    "megatron_h100.sh",
    "sglang_bundle.sh",
    "sglang_h100.sh",
    "step_h100.sh",
    "verl_bundle.sh",
    "vllm_bundle.sh",
)
WORDS = {"plan", "show", "list", "bundle", "ship", "wait", "collect", "stop", "--warm", "--chain", "--json"}


def quoted_stages(text: str) -> list[str]:
    """The stage names in every ``python -m benchmarks.gpu ...`` command of a text."""
    names = []
    for command in re.findall(r"python3? -m benchmarks\.gpu ([^`\n#(]+)", text):
        if command.startswith("bundle"):  # its argument is a bundle
            continue
        for word in command.split():
            if word not in WORDS and re.fullmatch(r"[a-z][a-z0-9.\-]*", word):
                names.append(word)
    return names


def gpu_row_names() -> set[str]:
    """The first word of every row of the ``| name |`` tables after "## GPU results"."""
    lines = DOCS.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("## GPU results"))
    names, in_table = set(), False
    for line in lines[start:]:
        if line.startswith("| name |"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and not line.startswith("|---"):
            names.add(line.split("|")[1].strip().split(" ")[0])
    return names


def test_every_stage_quoted_in_the_docs_is_declared():
    for path in (README, DOCS):
        quoted = quoted_stages(path.read_text())
        assert quoted, f"no `python -m benchmarks.gpu` command in {path.name}"
        unknown = sorted(set(quoted) - set(STAGES))
        assert not unknown, f"{path.name} quotes stages that are not declared: {unknown}"


def test_every_gpu_row_of_the_docs_is_mapped_to_a_stage_in_the_readme():
    table = README.read_text()
    missing = sorted(n for n in gpu_row_names() if f"`{n}" not in table)
    assert len(gpu_row_names()) > 80
    assert not missing, f"GPU rows of docs/benchmarks.md missing from the README's table: {missing}"


def test_every_stage_names_files_that_exist():
    ctx = Ctx(env={"NAME": "x", "VARIANT": "v a=b"})
    for stage in STAGES.values():
        assert (ROOT / stage.script).exists(), f"{stage.name}: {stage.script} does not exist"
        assert set(stage.bundles) <= set(bundles.BUNDLES), stage.name
        assert stage.seconds > 0 and stage.gpus in (1, 2, 4)
        for run in _runs(stage.build(ctx)):
            for word in run.argv:
                if word.endswith(".py") and "/" in word:
                    assert (ROOT / word).is_file(), (
                        f"{stage.name}: {run.name} runs {word}, which does not exist"
                    )
                if word.endswith("_test.py") or "/tests/" in word:
                    assert (ROOT / word.split("::")[0]).exists(), f"{stage.name}: {word}"


def _runs(actions):
    for a in actions:
        if isinstance(a, Run):
            yield a
        elif isinstance(a, Parallel):
            for branch in a.branches:
                yield from _runs(branch)
        elif isinstance(a, Unless):
            yield from _runs(a.actions)


def test_no_doc_points_at_a_deleted_script():
    for name in DELETED:
        assert not (ROOT / "benchmarks" / "gpu" / name).exists(), f"{name} is back"
    docs = [README, DOCS, ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for doc in docs:
        text = doc.read_text()
        for name in DELETED:
            assert name not in text, f"{doc.relative_to(ROOT)} still points at benchmarks/gpu/{name}"
        for ref in re.findall(r"benchmarks/gpu/[\w./-]+", text):
            assert (ROOT / ref.rstrip(".")).exists(), (
                f"{doc.relative_to(ROOT)} points at {ref}, which does not exist"
            )


def test_plan_ships_full_chunks_one_call_each_and_runs_with_the_small_ones():
    calls = plan.plan(["step-rlcore"], use_built=False)
    assert [c.carry for c in calls[:5]] == [[f".gpu/vllm/c{k}"] for k in range(1, 6)]
    assert all(c.command == "python3 -m benchmarks.gpu ship" for c in calls[:5])
    # unpacking, installing and rlcore's five steps do not fit one call: a chain, then a wait
    assert calls[5].command == "python3 -m benchmarks.gpu --chain step-rlcore"
    assert calls[5].carry == [".gpu/vllm/c6", ".gpu/tools"]
    assert calls[6].command == "python3 -m benchmarks.gpu wait" and calls[6].carry == []
    assert {c.kind for c in calls} == {"nvidia-h100-x1"}


def test_plan_for_both_engines_and_for_a_one_chunk_bundle():
    calls = plan.plan(["engines-bench"], use_built=False)
    assert len(calls) == 10  # vLLM c1-c5, SGLang c1-c4, then the last chunks of both with zstd
    assert calls[-1].command == "python3 -m benchmarks.gpu engines-bench"
    assert calls[-1].carry == [".gpu/sglang/c5", ".gpu/vllm/c6", ".gpu/tools"]
    calls = plan.plan(["megatron-pair-0.5b", "megatron-pair-1.5b", "megatron-tp2"], use_built=False)
    assert [c.as_dict() for c in calls] == [
        {
            "command": "python3 -m benchmarks.gpu megatron-pair-0.5b megatron-pair-1.5b megatron-tp2",
            "carry": [".gpu/megatron/c1", ".gpu/tools"],
            "kind": "nvidia-h100-x2",
            "timeout_s": 600,
        }
    ]
    seven_b = plan.plan(["megatron-7b"], use_built=False)[-1]
    assert (seven_b.kind, seven_b.needs_h200) == ("nvidia-h200-x2", True)
    warm = plan.plan(["fsdp-mfu-final"], warm=True, use_built=False)
    assert [c.as_dict() for c in warm] == [
        {
            "command": "python3 -m benchmarks.gpu fsdp-mfu-final",
            "carry": [],
            "kind": "nvidia-h100-x1",
            "timeout_s": 600,
        }
    ]


@pytest.mark.parametrize(
    "names", [["verl-fg", "step-compare"], ["fa4-attention"], ["sglang-tests", "sglang-bench"], list(STAGES)]
)
def test_every_carry_is_a_declared_chunk_and_fits_a_call(names):
    declared = {bundles.TOOLS} | {
        b.chunk_dir(k + 1) for b in bundles.BUNDLES.values() for k in range(len(b.chunk_mib))
    }
    calls = plan.plan(names, use_built=False)
    carried = [p for c in calls for p in c.carry]
    assert set(carried) <= declared and len(carried) == len(set(carried))
    needed = {
        bundles.BUNDLES[b].chunk_dir(k + 1)
        for b in plan.bundles_of(plan.resolve(names))
        for k in range(len(bundles.BUNDLES[b].chunk_mib))
    }
    assert needed <= set(carried)
    sizes = {b.chunk_dir(k + 1): mib for b in bundles.BUNDLES.values() for k, mib in enumerate(b.chunk_mib)}
    for c in calls:
        assert sum(sizes.get(p, bundles.TOOLS_MIB) for p in c.carry) <= plan.CARRY_MIB
        assert len(c.carry) <= 8  # the device tool's limit on carry paths


def test_plan_refuses_an_unknown_stage():
    with pytest.raises(SystemExit, match="step-rlcor"):
        plan.plan(["step-rlcor"])


def test_the_pythonpath_puts_the_project_first_and_sglangs_transformers_before_the_machines():
    assert STAGES["sglang-train-megatron"].pythonpath() == ("/tmp/proj", "/tmp/site")
    assert STAGES["verl"].pythonpath() == ("/tmp/proj", "/tmp/verl", "/tmp/vsite")
    assert STAGES["step-rlcore"].env()["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    runs = {r.name: r for r in _runs(STAGES["engines-bench"].build(Ctx()))}
    assert runs["bench-sglang"].path == ("/tmp/proj", "/tmp/site")
    assert runs["bench-vllm"].path == ("/tmp/proj", "/tmp/vsite")
    pair = STAGES["megatron-pair-0.5b"].build(Ctx(half_cpus="8"))
    envs = [r.env for r in _runs(pair) if r.name != "models"]
    assert envs == [
        {"CUDA_VISIBLE_DEVICES": "0", "BENCH_HOST_CPUS": "8"},
        {"CUDA_VISIBLE_DEVICES": "1", "BENCH_HOST_CPUS": "8"},
    ]


def test_knobs_change_the_commands_and_a_missing_one_is_named():
    base = [r.name for r in _runs(STAGES["megatron-seq-0.5b"].build(Ctx()))]
    eager_off = [r.name for r in _runs(STAGES["megatron-seq-0.5b"].build(Ctx(env={"EAGER": "0"})))]
    assert "seq-0.5b-megatron-eager" in base and "seq-0.5b-megatron-eager" not in eager_off
    step = list(_runs(STAGES["step-rlcore"].build(Ctx(env={"STEP_OVERRIDES": "a=1 b=2"}))))
    assert step[0].argv[-2:] == ("a=1", "b=2")
    with pytest.raises(SystemExit, match="NAME"):
        STAGES["step-named"].build(Ctx(describing=False))
    assert "$NAME" in "\n".join(describe(STAGES["step-named"].build(Ctx()), STAGES["step-named"], Ctx()))


def _wheel(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, mode, text in (
            ("ray/core/src/ray/raylet/raylet", 0o755, "#!/bin/sh\n"),
            ("ray/__init__.py", 0o644, ""),
            ("sgl_kernel/flash_ops.abi3.so", 0o644, "x" * 3000),
        ):
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | mode) << 16
            z.writestr(info, text)


def test_a_bundle_survives_chunking_shipping_and_unpacking_with_its_exec_bits(tmp_path, monkeypatch):
    """The local build's steps (unpack with modes, trim, tar | zstd, chunks) and the machine's (stage what
    each call carried, check, unpack) on a fake wheel, with chunks of 100 bytes."""
    site = tmp_path / "site"
    _wheel(tmp_path / "ray-0-py3-none-any.whl")
    bundles.unpack_wheel(tmp_path / "ray-0-py3-none-any.whl", site)
    bundle = replace(
        bundles.BUNDLES["sglang"],
        stage=str(tmp_path / "stage"),
        site=str(tmp_path / "unpacked"),
        marker="ray",
    )
    monkeypatch.setattr(device, "BUNDLES", {"sglang": bundle})
    monkeypatch.setattr(device, "DEVICE_TOOLS", str(tmp_path / "tools"))
    assert bundles.trim(site, bundle) == ["sgl_kernel/flash_ops.abi3.so"]
    archive = tmp_path / "site.tar.zst"
    tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
    subprocess.run(["zstd", "-q", "-o", str(archive)], stdin=tar.stdout, check=True)
    tar.wait()
    built = tmp_path / "checkout" / bundle.local
    manifest = bundles.split_into_chunks(archive, built, "sglang", chunk_bytes=100)
    assert len(manifest["parts"]) > 1
    for p in manifest["parts"]:  # one call per chunk, each carrying only its chunk folder
        call = tmp_path / f"call{p['chunk']}"
        shutil.copytree(built / f"c{p['chunk']}", call / bundle.chunk_dir(p["chunk"]))
        device.ship(call)
    device.unpack(bundle)
    raylet = tmp_path / "unpacked" / "ray/core/src/ray/raylet/raylet"
    assert raylet.stat().st_mode & 0o111, "Ray's raylet lost its exec bit"
    assert not (tmp_path / "unpacked" / "sgl_kernel" / "flash_ops.abi3.so").exists()
    device.unpack(bundle)  # a later call finds it unpacked


def test_a_torn_chunk_is_named_before_unpacking(tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "manifest.json").write_text(
        json.dumps({"parts": [{"chunk": 2, "name": "part.1", "bytes": 5, "sha256": "0"}]})
    )
    bundle = replace(bundles.BUNDLES["vllm"], stage=str(stage), site=str(tmp_path / "site"))
    with pytest.raises(SystemExit, match=r"part.1 is missing .*ship .gpu/vllm/c2"):
        device.unpack(bundle)


def test_missing_wheels_are_found_by_name_and_pinned_version():
    files = ["ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl", "pydantic_core-2.50.4-cp312-abi3.whl"]
    assert bundles.missing_wheels(
        ("ray==2.60.0", "pydantic-core==2.50.4", "fastapi<0.137,>=0.133", "cattrs"), files
    ) == [
        "fastapi<0.137,>=0.133",
        "cattrs",
    ]
    assert bundles.missing_wheels(("ray==2.59.0",), files) == ["ray==2.59.0"]


def test_a_stage_runs_logs_and_comes_back_packed_when_more_than_eight_files(tmp_path):
    res, out = tmp_path / "res", tmp_path / "out"
    res.mkdir()
    ctx = Ctx(res=str(res), describing=False)
    code = device.run_process(Run("hello", 30, (sys.executable, "-c", "print('hi')")), ctx, (), {})
    assert (
        code == 0 and "hi" in (res / "hello.log").read_text() and "exit 0" in (res / "hello.log").read_text()
    )
    assert "== hello" in (res / "commands.txt").read_text()
    results.collect(res, out)
    assert sorted(p.name for p in out.iterdir()) == ["commands.txt", "hello.log"]
    for i in range(9):
        (res / f"r{i}.json").write_text("{}")
    (res / "grpo_step" / "qwen2-0.5B").mkdir(parents=True)
    (res / "grpo_step" / "qwen2-0.5B" / "config.json").write_text("{}")  # a model: stays on the machine
    run = res / "grpo_step" / "runs" / "tuned"
    (run / "logs").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "logs" / "worker.log").write_text("Ray's log: stays")
    out2 = tmp_path / "out2"
    results.collect(res, out2)
    assert sorted(p.name for p in out2.iterdir()) == ["commands.txt", "results.tgz"]
    with tarfile.open(fileobj=io.BytesIO((out2 / "results.tgz").read_bytes())) as tar:
        names = tar.getnames()
    assert "r8.json" in names and "grpo_step/runs/tuned/metrics.jsonl" in names
    assert not any("qwen2" in n or "worker.log" in n for n in names)


def test_the_command_line_lists_shows_and_plans(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "benchmarks.gpu", *args], cwd=ROOT, capture_output=True, text=True
        )

    listing = run("list")
    assert listing.returncode == 0 and all(name in listing.stdout for name in STAGES)
    shown = run("show", "sglang-tests")
    assert "PYTHONPATH=/tmp/proj:/tmp/site RLCORE_SGLANG_TEST_MODEL=" in shown.stdout
    planned = json.loads(run("plan", "--json", "megatron-nccl").stdout)
    assert planned[-1]["command"] == "python3 -m benchmarks.gpu megatron-nccl"
    dry = run("bundle", "verl", "--dry-run")
    assert dry.returncode == 0 and "antlr4-python3-runtime==4.9.3" in dry.stdout
