"""python -m benchmarks.gpu: the GPU harness's one entry point.

Here (the CPU machine):
    list                              the declared stages
    show STAGE ...                    the exact commands a stage runs
    plan [--warm] [--chain] [--json] STAGE ...   the device calls (command + carry) that run them
    bundle NAME [--dry-run]           build an offline bundle into .gpu/NAME (vllm sglang megatron verl fa4)

On the GPU machine (the device call's command, from the checkout's root):
    [--chain] STAGE ...               stage carried chunks, unpack, install the project, run (--chain: detached)
    ship                              only stage the chunks this call carried
    wait                              wait for the chain up to WAIT seconds, then bring back what finished
    collect                           bring back RES's results into $OUT
    stop                              end the chain (and a detached verl run) by process group
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from . import device, plan, results
from .actions import Ctx, Do, FreeGpu, Parallel, Run, Unless
from .bundles import BUNDLES, build, build_steps
from .stages import STAGES, Stage

COMMANDS = ("list", "show", "plan", "bundle", "ship", "wait", "collect", "stop")


def describe(actions, stage: Stage, ctx: Ctx, indent: str = "") -> list[str]:
    lines = []
    for a in actions:
        if isinstance(a, Run):
            path = a.path if a.path is not None else stage.pythonpath()
            env = {"PYTHONPATH": ":".join(path), **a.env} if path else dict(a.env)
            prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            to = ">>" if a.append else ">"
            lines.append(
                f"{indent}{prefix + ' ' if prefix else ''}timeout {a.limit} {shlex.join(a.argv)} {to} {ctx.res}/{a.name}.log"
            )
        elif isinstance(a, FreeGpu):
            lines.append(f"{indent}# end every process holding the GPU (by pid)")
        elif isinstance(a, Do):
            lines.append(f"{indent}# {a.text}")
        elif isinstance(a, Unless):
            lines.append(f"{indent}# unless {a.path} exists:")
            lines += describe(a.actions, stage, ctx, indent + "    ")
        elif isinstance(a, Parallel):
            for i, branch in enumerate(a.branches, 1):
                lines.append(f"{indent}# at the same time, branch {i}:")
                lines += describe(branch, stage, ctx, indent + "    ")
    return lines


def cmd_list() -> None:
    width = max(len(n) for n in STAGES)
    print(f"{'stage':<{width}}  {'kind':<16} {'bundles':<13} {'~s':>4}  what")
    for s in STAGES.values():
        print(f"{s.name:<{width}}  {s.kind:<16} {','.join(s.bundles) or '-':<13} {s.seconds:>4}  {s.doc}")


def cmd_show(names: list[str]) -> None:
    ctx = Ctx(env=dict(os.environ))
    for s in plan.resolve(names):
        print(f"## {s.name}: {s.doc}")
        print(f"# script {s.script}; bundles {', '.join(s.bundles) or 'none'}; {s.kind}; about {s.seconds} s")
        env = " ".join(f"{k}={v}" for k, v in s.env().items())
        print(f"# environment: {env}" + ("; the project installed into /tmp/proj first" if s.project else ""))
        print("\n".join(describe(s.build(ctx), s, ctx)))


def run_stages(names: list[str], chain: bool, in_chain: bool) -> None:
    ctx = Ctx.on_device()
    res = Path(ctx.res)
    res.mkdir(parents=True, exist_ok=True)
    out = os.environ.get("OUT")
    start = time.time()
    try:
        stages = plan.resolve(names)
        if not in_chain:
            running = results.chain_running(res)
            if running:
                raise SystemExit(f"a chain is running (pid {running}): `wait` for it, or `stop` it first")
            device.ship()
        for b in plan.bundles_of(stages):
            device.unpack(BUNDLES[b])
        if any(s.project for s in stages) and "setup" not in names:
            device.install_project(res, force=False)
        if chain:
            results.start_chain(res, names)
            budget = float(os.environ.get("WAIT") or plan.CALL_SECONDS + 30 - (time.time() - start))
            results.wait_chain(res, max(0.0, budget))
            return
        for s in stages:
            t0 = time.time()
            device.note(res, f"## stage {s.name} ({time.strftime('%T')})")
            device.execute(s.build(ctx), ctx, s.pythonpath(), s.env())
            device.note(res, f"## stage {s.name} took {time.time() - t0:.0f} s")
    finally:
        if in_chain:
            (res / "chain.done").touch()
        elif out:
            results.collect(res, Path(out))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    word = argv[0]
    if word not in COMMANDS:
        p = argparse.ArgumentParser(
            prog="python3 -m benchmarks.gpu", description="run stages on the GPU machine"
        )
        p.add_argument(
            "--chain", action="store_true", help="run detached, outliving this call; `wait` for it"
        )
        p.add_argument("--in-chain", action="store_true", help=argparse.SUPPRESS)
        p.add_argument("stages", nargs="+")
        args = p.parse_args(argv)
        run_stages(args.stages, args.chain, args.in_chain)
        return
    rest = argv[1:]
    res = Path(os.environ.get("RES", "/tmp/res"))
    if word == "list":
        cmd_list()
    elif word == "show":
        cmd_show(rest)
    elif word == "plan":
        p = argparse.ArgumentParser(prog="python -m benchmarks.gpu plan")
        p.add_argument("--warm", action="store_true", help="bundles unpacked and project installed already")
        p.add_argument(
            "--chain", action="store_true", default=None, help="run detached even if it fits a call"
        )
        p.add_argument("--json", action="store_true")
        p.add_argument("stages", nargs="+")
        args = p.parse_args(rest)
        calls = plan.plan(args.stages, warm=args.warm, chain=args.chain)
        print(plan.render(args.stages, calls, args.json))
    elif word == "bundle":
        p = argparse.ArgumentParser(prog="python -m benchmarks.gpu bundle")
        p.add_argument("name", choices=sorted(BUNDLES))
        p.add_argument("--dry-run", action="store_true", help="print the steps, download nothing")
        args = p.parse_args(rest)
        bundle = BUNDLES[args.name]
        if args.dry_run:
            print(f"# {bundle.name}: {bundle.doc}\n# unpacked on the machine into {bundle.site}")
            print("\n".join(build_steps(bundle)))
        else:
            build(bundle)
    elif word == "ship":
        device.ship()
    elif word == "wait":
        try:
            results.wait_chain(res, float(os.environ.get("WAIT") or plan.WAIT_SECONDS))
        finally:
            if os.environ.get("OUT"):
                results.collect(res, Path(os.environ["OUT"]))
    elif word == "collect":
        results.collect(res, Path(os.environ.get("OUT") or "/tmp/out"))
    elif word == "stop":
        results.stop(res)


if __name__ == "__main__":
    main()
