"""A worker process that dies or hangs on cue, for the tests of what the run does when one does.

``RLCORE_TEST_DIE="role:rank:method:nth:marker[,...]"`` in the environment of the run (the driver's, which
Ray's workers of a local cluster inherit): the worker of ``role`` and ``rank`` ends its own process
(``os._exit``, as a kill or the OOM killer would end it, nothing cleaned up) when ``method`` is called the
``nth`` time in that process, unless the file ``marker`` exists; it creates the file first, so the
restarted workers of the same run do not die of the same cue again. Several cues, comma-separated.

``RLCORE_TEST_HANG="role:rank:method:seconds[,...]"`` (in the worker's environment, e.g. a group's
``env_vars``): the worker of ``role`` and ``rank`` sleeps ``seconds`` before every ``method`` call, as a
collective whose peer never comes would hold it.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

DIE_ENV = "RLCORE_TEST_DIE"
HANG_ENV = "RLCORE_TEST_HANG"

_calls: Counter[tuple[str, int, str]] = Counter()


def maybe_die(role: str, rank: int, method: str) -> None:
    """End this process if :data:`DIE_ENV` names this call (see the module doc); else nothing."""
    spec = os.environ.get(DIE_ENV)
    if not spec:
        return
    _calls[(role, rank, method)] += 1
    for cue in spec.split(","):
        want_role, want_rank, want_method, nth, marker = cue.split(":", 4)
        if (role, str(rank), method, _calls[(role, rank, method)]) != (
            want_role,
            want_rank,
            want_method,
            int(nth),
        ):
            continue
        if Path(marker).exists():
            continue
        Path(marker).write_text(f"{role} rank {rank} died in {method} call {nth} (pid {os.getpid()})\n")
        os._exit(137)


def maybe_hang(role: str, rank: int, method: str) -> None:
    """Sleep if :data:`HANG_ENV` names this call (see the module doc); else nothing."""
    for cue in filter(None, os.environ.get(HANG_ENV, "").split(",")):
        want_role, want_rank, want_method, seconds = cue.split(":", 3)
        if (role, str(rank), method) == (want_role, want_rank, want_method):
            time.sleep(float(seconds))


#: ``RLCORE_TEST_SKIP_WEIGHTS="prefix:from_sync"``: every rollout worker leaves out of the weight streams it
#: loads the tensors whose name starts with ``prefix`` (one layer: ``model.layers.1.``), from its
#: ``from_sync``-th load on (1 is the initial sync), as a sync whose names for one layer mapped to nothing
#: would; the engine keeps that layer's old weights. For the post-sync check's tests.
SKIP_WEIGHTS_ENV = "RLCORE_TEST_SKIP_WEIGHTS"

_loads: Counter[str] = Counter()


def maybe_skip_weights(buckets):
    """``buckets`` (a weight stream), less what :data:`SKIP_WEIGHTS_ENV` names; as is when it is unset."""
    spec = os.environ.get(SKIP_WEIGHTS_ENV)
    if not spec:
        return buckets
    prefix, from_sync = spec.rsplit(":", 1)
    _loads[spec] += 1
    if _loads[spec] < int(from_sync):
        return buckets
    return ([(n, t) for n, t in bucket if not n.startswith(prefix)] for bucket in buckets)
