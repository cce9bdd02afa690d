"""The device calls that run a list of stages on a fresh machine: which call carries which chunk, and when
the work must run as a detached chain with ``wait`` calls after it.

A call carries at most 64 MiB and lasts at most 600 s, and the machine is given back when a call does not
start within 30 s of the previous one ending: the chunks of full size ship one call each, the small ones
(each bundle's last chunk, the one-chunk bundles, zstd) ride with the call that runs the stages.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from .bundles import BUNDLES, TOOLS, TOOLS_MIB, built_chunk_mib
from .stages import STAGES, Stage

#: What one call may carry of bundles: 16 MiB of a call's 64 stay for the checkout that travels with it
#: (15 MiB on 2026-12-07).
CARRY_MIB = 48
#: Seconds of work one call runs in the foreground, inside its 600 s limit (start-up and collecting aside).
CALL_SECONDS = 540
#: What a `wait` call waits for the chain before it collects (WAIT overrides it on the machine).
WAIT_SECONDS = 560
UNPACK_SECONDS = {"vllm": 40, "sglang": 40, "megatron": 5, "verl": 5, "fa4": 15}
SETUP_SECONDS = 30


@dataclass
class Call:
    command: str
    carry: list[str] = field(default_factory=list)
    kind: str = "nvidia-h100-x1"
    needs_h200: bool = False
    timeout_s: int = 600
    why: str = ""

    def as_dict(self) -> dict:
        d = {"command": self.command, "carry": self.carry, "kind": self.kind, "timeout_s": self.timeout_s}
        if self.needs_h200:
            d["needs_h200"] = True
        return d


def resolve(names: list[str]) -> list[Stage]:
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        close = {n: [s for s in STAGES if n in s or s in n][:5] for n in unknown}
        hint = "; ".join(f"{n}: did you mean {', '.join(c)}?" if c else n for n, c in close.items())
        raise SystemExit(f"unknown stage(s): {hint} (`python -m benchmarks.gpu list` shows them all)")
    return [STAGES[n] for n in names]


def kind_of(stages: list[Stage]) -> tuple[str, bool]:
    """One machine for the whole plan: the most GPUs any stage needs, H200s if any needs their memory."""
    gpus = max(s.gpus for s in stages)
    h200 = any(s.h200 for s in stages)
    if gpus == 1:
        return ("nvidia-h200" if h200 else "nvidia-h100-x1"), h200
    return (f"nvidia-h200-x{gpus}" if h200 else f"nvidia-h100-x{gpus}"), h200


def bundles_of(stages: list[Stage]) -> list[str]:
    seen: list[str] = []
    for s in stages:
        for b in s.bundles:
            if b not in seen:
                seen.append(b)
    return seen


def chunk_sizes(bundle: str, use_built: bool) -> tuple[float, ...]:
    built = built_chunk_mib(BUNDLES[bundle]) if use_built else None
    return built or BUNDLES[bundle].chunk_mib


def seconds_of(stages: list[Stage], warm: bool) -> int:
    total = sum(s.seconds for s in stages)
    if not warm:
        total += sum(UNPACK_SECONDS.get(b, 20) for b in bundles_of(stages))
        total += SETUP_SECONDS if any(s.project for s in stages) else 0
    return total


def plan(
    names: list[str], *, warm: bool = False, chain: bool | None = None, use_built: bool = True
) -> list[Call]:
    """The calls, in order. ``warm``: the bundles are unpacked and the project installed already."""
    stages = resolve(names)
    kind, h200 = kind_of(stages)
    calls: list[Call] = []
    final_carry: list[str] = []
    if not warm and bundles_of(stages):
        chunks = [
            (BUNDLES[b].chunk_dir(k + 1), mib)
            for b in bundles_of(stages)
            for k, mib in enumerate(chunk_sizes(b, use_built))
        ]
        # The smallest chunks ride with the last call (with zstd, which that call needs to unpack).
        room = CARRY_MIB - TOOLS_MIB
        for path, mib in sorted(chunks, key=lambda c: c[1]):
            if mib <= room:
                final_carry.append(path)
                room -= mib
        shipped = [c for c in chunks if c[0] not in final_carry]
        # The others go one call each, or several to a call while they fit (in bundle order).
        batch: list[str] = []
        batch_mib = 0.0
        for path, mib in shipped:
            if batch and batch_mib + mib > CARRY_MIB:
                calls.append(
                    Call("python3 -m benchmarks.gpu ship", batch, kind, h200, 120, "stage chunks in /tmp")
                )
                batch, batch_mib = [], 0.0
            batch.append(path)
            batch_mib += mib
        if batch:
            calls.append(
                Call("python3 -m benchmarks.gpu ship", batch, kind, h200, 120, "stage chunks in /tmp")
            )
        final_carry = sorted(final_carry) + [TOOLS]
    total = seconds_of(stages, warm)
    chained = chain if chain is not None else total > CALL_SECONDS
    stage_words = " ".join(names)
    if not chained:
        calls.append(
            Call(f"python3 -m benchmarks.gpu {stage_words}", final_carry, kind, h200, 600, f"about {total} s")
        )
        return calls
    calls.append(
        Call(
            f"python3 -m benchmarks.gpu --chain {stage_words}",
            final_carry,
            kind,
            h200,
            600,
            f"starts about {total} s of work detached, waits, collects",
        )
    )
    waits = max(1, math.ceil((total - CALL_SECONDS) / WAIT_SECONDS))
    for i in range(waits):
        calls.append(
            Call(
                "python3 -m benchmarks.gpu wait",
                [],
                kind,
                h200,
                600,
                f"wait {i + 1} of about {waits}: again until it prints 'chain done'",
            )
        )
    return calls


def render(names: list[str], calls: list[Call], as_json: bool = False) -> str:
    if as_json:
        return json.dumps([c.as_dict() for c in calls], indent=1)
    stages = resolve(names)
    kind, h200 = kind_of(stages)
    lines = [
        f"# {' '.join(names)}: {len(calls)} device call(s) on {kind}" + (" (needs_h200)" if h200 else ""),
        "# each call within 30 s of the previous one ending, or the machine is given back (start over);",
        "# results come back under $OUT (results.tgz when more than 8 files); knobs (SHAPE=...) go before python3",
    ]
    for i, c in enumerate(calls, 1):
        lines.append(f"call {i}: {c.why}")
        lines.append(f"  command: {c.command}")
        lines.append(f"  carry:   {json.dumps(c.carry)}")
        lines.append(
            f"  kind: {c.kind}"
            + ("  needs_h200: true" if c.needs_h200 else "")
            + f"  timeout_s: {c.timeout_s}"
        )
    return "\n".join(lines)
