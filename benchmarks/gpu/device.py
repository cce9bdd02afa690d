"""What runs on the lent GPU machine: staging the carried chunks, unpacking bundles, installing the project,
and running a stage's actions.

The machine keeps ``/tmp`` while it stays warm (a call must start within 30 s of the previous one ending),
so chunks shipped by earlier calls wait in each bundle's stage folder, unpacked sites and the installed
project (``/tmp/proj``) serve every later call, and results accumulate in ``RES`` (``/tmp/res``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from .actions import Ctx, Do, FreeGpu, Parallel, Run, Unless
from .bundles import BUNDLES, TOOLS, Bundle

PROJ = "/tmp/proj"
#: zstd and its libraries, kept once a call carried them: later calls can unpack without carrying them.
DEVICE_TOOLS = "/tmp/gpu-tools"
#: The packages installed into PROJ, with pip --no-deps --no-index (setuptools is the machine's only build
#: backend). Their entry points are read from the installed metadata, hence an install and not a path.
PROJECT = ("./core", "./plugins/fsdp", "./plugins/megatron", "./plugins/vllm", "./plugins/sglang")
_lock = threading.Lock()


def say(text: str) -> None:
    with _lock:
        print(text, flush=True)


def note(res: Path, line: str) -> None:
    """One line in ``commands.txt``: what ran, in order, with its environment."""
    say(line)
    with _lock, (res / "commands.txt").open("a") as f:
        f.write(line + "\n")


# -- chunks and bundles ------------------------------------------------------------------------------------


def ship(root: Path = Path(".")) -> None:
    """Copy every chunk this call carried (``.gpu/<bundle>/cK``) into its bundle's stage folder, and zstd."""
    for bundle in BUNDLES.values():
        chunks = sorted((root / bundle.local).glob("c[0-9]*"))
        if not chunks:
            continue
        stage = Path(bundle.stage)
        stage.mkdir(parents=True, exist_ok=True)
        for chunk in chunks:
            for f in chunk.iterdir():
                shutil.copyfile(f, stage / f.name)
        say(f"{bundle.name}: staged {', '.join(c.name for c in chunks)} in {stage} ({_staged(bundle)})")
    if (root / TOOLS).is_dir():
        shutil.copytree(root / TOOLS, DEVICE_TOOLS, dirs_exist_ok=True)
        os.chmod(Path(DEVICE_TOOLS) / "zstd", 0o755)


def _staged(bundle: Bundle) -> str:
    manifest = Path(bundle.stage) / "manifest.json"
    if not manifest.is_file():
        return "no manifest yet"
    parts = json.loads(manifest.read_text())["parts"]
    have = sum((Path(bundle.stage) / p["name"]).is_file() for p in parts)
    return f"{have} of {len(parts)} parts"


def _marker(bundle: Bundle) -> Path:
    return Path(bundle.site) / ".rlcore-bundle.json"


def unpack(bundle: Bundle) -> None:
    """Unpack a shipped bundle into its site folder, once per machine."""
    if _marker(bundle).is_file():
        return
    stage = Path(bundle.stage)
    if not (stage / "manifest.json").is_file():
        raise SystemExit(
            f"bundle {bundle.name} was not shipped to this machine ({stage} is empty): "
            f"`python -m benchmarks.gpu plan ...` lists the calls that carry {bundle.local}/c1 .. cN"
        )
    manifest = json.loads((stage / "manifest.json").read_text())
    for p in manifest["parts"]:
        path = stage / p["name"]
        if not path.is_file() or path.stat().st_size != p["bytes"]:
            raise SystemExit(
                f"bundle {bundle.name}: {p['name']} is missing or torn in {stage}: ship {bundle.local}/c{p['chunk']}"
            )
        if hashlib.sha256(path.read_bytes()).hexdigest() != p["sha256"]:
            raise SystemExit(
                f"bundle {bundle.name}: {p['name']} differs from the manifest: rebuild and ship again"
            )
    zstd, env = _zstd()
    site = Path(bundle.site)
    site.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tar = subprocess.Popen(["tar", "-C", str(site), "-xf", "-"], stdin=subprocess.PIPE)
    unzip = subprocess.Popen([zstd, "-d", "-q", "-c"], stdin=subprocess.PIPE, stdout=tar.stdin, env=env)
    tar.stdin.close()  # zstd holds the pipe now
    for p in manifest["parts"]:
        with (stage / p["name"]).open("rb") as f:
            shutil.copyfileobj(f, unzip.stdin, 1 << 20)
    unzip.stdin.close()
    if unzip.wait() != 0 or tar.wait() != 0:
        raise SystemExit(f"bundle {bundle.name}: unpacking into {site} failed")
    _executable(site)
    if not (site / bundle.marker).is_dir():
        raise SystemExit(f"bundle {bundle.name}: {bundle.marker}/ missing in {site} after unpacking")
    _marker(bundle).write_text(json.dumps(manifest))
    say(f"{bundle.name}: unpacked into {site} in {time.time() - t0:.0f} s ({len(os.listdir(site))} entries)")


def _zstd() -> tuple[str, dict[str, str]]:
    for tools in (Path(DEVICE_TOOLS), Path(TOOLS)):
        if (tools / "zstd").is_file():
            env = dict(os.environ, LD_LIBRARY_PATH=str(tools.resolve()))
            return str((tools / "zstd").resolve()), env
    if shutil.which("zstd"):
        return "zstd", dict(os.environ)
    raise SystemExit(
        f"no zstd on this machine: carry {TOOLS} with this call (`plan` puts it in the last one)"
    )


def _executable(site: Path) -> None:
    """Ray's raylet and gcs_server lost their exec bit in an earlier unpack: make sure they have it."""
    for path in site.glob("ray/core/src/ray/**/*"):
        if path.is_file() and not path.suffix:
            path.chmod(path.stat().st_mode | 0o111)


def install_project(res: Path, force: bool) -> None:
    """The project into PROJ. pip --target keeps an existing folder, so a re-install starts from nothing."""
    stamp = Path(PROJ) / ".rlcore-installed"
    if stamp.is_file() and not force:
        return
    shutil.rmtree(PROJ, ignore_errors=True)
    cmd = ["python3", "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation"]
    cmd += ["--target", PROJ, *PROJECT]
    note(res, f"== setup: {shlex.join(cmd)}")
    with (res / "setup.log").open("w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.flush()
        smi(["--query-gpu=name,memory.total,driver_version", "--format=csv"], log)
    say(f"setup exit {done.returncode}\n" + (res / "setup.log").read_text()[-2000:])
    if done.returncode != 0:
        raise SystemExit("installing the project failed (setup.log)")
    stamp.write_text(time.strftime("%F %T"))


# -- running a stage ---------------------------------------------------------------------------------------


def free_gpu(res: Path) -> None:
    """End every process holding a GPU device open, but this one and its parents (nvidia-smi lists none in
    the container). By pid: `pkill -f` matched the call's own command line and ended it."""
    spare = _ancestors()
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid in spare:
            continue
        try:
            holds = any(os.readlink(fd).startswith("/dev/nvidia") for fd in (proc / "fd").iterdir())
        except OSError:
            continue
        if holds:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    time.sleep(3)
    note(res, f"free_gpu: {smi(['--query-gpu=memory.used,memory.total', '--format=csv,noheader'])}")


def smi(args: list[str], log=None) -> str:
    """nvidia-smi's answer (written to ``log`` too when given); a note where the machine has none."""
    if shutil.which("nvidia-smi") is None:
        text = "no nvidia-smi on this machine"
    else:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True)
        text = (done.stdout + done.stderr).strip()
    if log is not None:
        log.write(text + "\n")
    return text


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def run_process(run: Run, ctx: Ctx, path: Sequence[str], base_env: dict[str, str]) -> int:
    res = Path(ctx.res)
    pythonpath = run.path if run.path is not None else tuple(path)
    env = dict(os.environ, **base_env, **run.env)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = ":".join(pythonpath)
    shown = {"PYTHONPATH": env["PYTHONPATH"]} if pythonpath else {}
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**shown, **run.env}.items())
    note(res, f"== {run.name} ({time.strftime('%T')}): {prefix} {shlex.join(run.argv)}")
    log_path = res / f"{run.name}.log"
    t0 = time.time()
    with log_path.open("a" if run.append else "w") as log:
        # timeout ends the whole process group it starts (an engine's scheduler processes too).
        code = subprocess.run(
            ["timeout", str(run.limit), *run.argv], stdout=log, stderr=subprocess.STDOUT, env=env
        ).returncode
        log.write(f"exit {code} after {time.time() - t0:.0f} s\n")
    if not run.append:
        lines = log_path.read_text(errors="replace").splitlines()
        picked = [x for x in lines if re.search(run.show, x)] if run.show else lines[-run.tail :]
        say("\n".join(picked[-60:]))
    return code


def execute(actions: Sequence[object], ctx: Ctx, path: Sequence[str], base_env: dict[str, str]) -> None:
    for action in actions:
        if isinstance(action, Run):
            run_process(action, ctx, path, base_env)
        elif isinstance(action, FreeGpu):
            free_gpu(Path(ctx.res))
        elif isinstance(action, Do):
            action.fn(ctx)
        elif isinstance(action, Unless):
            if not Path(action.path).exists():
                execute(action.actions, ctx, path, base_env)
        elif isinstance(action, Parallel):
            threads = [
                threading.Thread(target=execute, args=(branch, ctx, path, base_env))
                for branch in action.branches
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            raise TypeError(f"not an action: {action!r}")
