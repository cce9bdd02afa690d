"""Runs longer than one call, and what a call brings back.

A call lasts at most 10 minutes and the machine is given back 30 s after one ends, so a longer list of
stages starts detached in one call (``--chain``) and is waited for by the next ones (``wait``); each call
brings back what has finished. A call returns at most 8 files, and its ``$OUT`` starts empty: results stay
in ``RES`` while the machine is warm and every call copies them back (one ``results.tgz`` beside
``commands.txt`` when there are more than 8).
"""

from __future__ import annotations

import fnmatch
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from .device import note, say

#: What comes back: results, logs and tables; models and checkpoints stay on the machine, and of a run
#: folder (``runs/<name>/``: Ray's logs, checkpoints) only its metrics.jsonl.
KEEP = ("*.json", "*.jsonl", "*.log", "*.txt", "*.csv", "*.xml", "*.tgz", "*.png")
SKIP_DIRS = ("qwen2*", "tokenizer*", "checkpoints")
MAX_FILE = 4 << 20
MAX_FILES = 8


def _wanted(res: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(res):
        dirnames[:] = [d for d in dirnames if not any(fnmatch.fnmatch(d, p) for p in SKIP_DIRS)]
        for name in filenames:
            path = Path(dirpath) / name
            if "runs" in path.relative_to(res).parts[:-1] and name != "metrics.jsonl":
                continue
            if any(fnmatch.fnmatch(name, p) for p in KEEP) and path.stat().st_size <= MAX_FILE:
                files.append(path)
    return sorted(files)


def collect(res: Path, out: Path) -> None:
    """Copy RES's results into the call's $OUT: as they are when 8 or fewer, else as results.tgz."""
    files = _wanted(res)
    out.mkdir(parents=True, exist_ok=True)
    if len(files) <= MAX_FILES:
        for f in files:
            dest = out / f.relative_to(res)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.read_bytes())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            archive = Path(tmp) / "results.tgz"
            with tarfile.open(archive, "w:gz") as tar:
                for f in files:
                    tar.add(f, arcname=str(f.relative_to(res)))
            (out / "results.tgz").write_bytes(archive.read_bytes())
        if (res / "commands.txt").is_file():
            (out / "commands.txt").write_bytes((res / "commands.txt").read_bytes())
    say(
        f"collected {len(files)} file(s) into $OUT"
        + (" as results.tgz (tar -xzf results.tgz)" if len(files) > MAX_FILES else "")
    )


def _pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, IndexError):
        return None


def chain_running(res: Path) -> int | None:
    if (res / "chain.done").exists():
        return None
    return _pid(res / "chain.pid")


def start_chain(res: Path, stages: list[str]) -> None:
    """Run ``stages`` detached (own session, no hang-up): they outlive this call. chain.done when over."""
    (res / "chain.done").unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "OUT"}  # the chain's files stay in RES
    with (res / "chain.log").open("w") as log:
        proc = subprocess.Popen(
            ["nohup", sys.executable, "-m", "benchmarks.gpu", "--in-chain", *stages],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    (res / "chain.pid").write_text(str(proc.pid))
    note(
        res,
        f"chain started ({' '.join(stages)}): pid {proc.pid}; stop it with `python3 -m benchmarks.gpu stop`",
    )


def wait_chain(res: Path, seconds: float, lines: int = 40) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline and chain_running(res):
        time.sleep(1)
    if (res / "chain.done").exists():
        say("chain done")
    elif chain_running(res):
        say("chain still running: call `python3 -m benchmarks.gpu wait` again within 30 s")
    else:
        say("chain ended without chain.done (killed?): see chain.log")
    log = res / "chain.log"
    if log.is_file():
        say("\n".join(log.read_text(errors="replace").splitlines()[-lines:]))


def stop(res: Path) -> None:
    """End the chain and a detached verl run by their process groups (never by name: see README.md)."""
    for name in ("chain.pid", "verl/pid"):
        pid = _pid(res / name)
        if pid is None:
            continue
        try:
            os.killpg(pid, signal.SIGTERM)
            time.sleep(5)
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        say(f"stopped {name} ({pid})")
