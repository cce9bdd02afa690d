"""Which finished groups a step trains on: the stream's selection policies (``trainer.stream.policy``).

A policy is a plugin axis (hook ``register_stream_policies``), the built-ins registered like a third
party's. It sees the finished, scored groups waiting in the stream and picks the ``need`` a step trains
on; the rest wait for a later step. The staleness bound is the stream's, not the policy's: groups past
``trainer.max_staleness`` are dropped (and their prompts generated again) before a policy sees them, so no
policy can break it.

Write one as a class with a ``select`` method and register it::

    class Longest:
        def select(self, finished, need, version):
            ranked = sorted(finished, key=lambda g: -max(len(r.tokens) for r in g.responses))
            return ranked[:need]

    @hookimpl
    def register_stream_policies(register):
        register("longest", "my_pkg.policies:Longest")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class StreamPolicy(Protocol):
    """Picks a step's groups from the finished ones."""

    def select(self, finished: Sequence[Any], need: int, version: int) -> list[Any]:
        """``need`` of ``finished`` (:class:`~rlcore.stream.groups.Group`, in admission order, each with
        ``seq``, ``admitted_step``, ``finished_round``, ``oldest_version`` and its ``responses``), in the order
        the batch holds them. ``version``: the weights the step updates. Groups not returned stay."""


class Fifo:
    """Oldest admitted first (the default): a group that took long is not passed over by later short
    ones, so the length bias of taking groups as they finish stays small and staleness low."""

    def select(self, finished: Sequence[Any], need: int, version: int) -> list[Any]:
        return sorted(finished, key=lambda g: g.seq)[:need]


class FinishOrder:
    """The first groups to finish (slime's and Agent-Lightning's order): the freshest samples, at the
    price of favouring short responses; long groups wait until too few short ones are left."""

    def select(self, finished: Sequence[Any], need: int, version: int) -> list[Any]:
        return sorted(finished, key=lambda g: (g.finished_round, g.seq))[:need]
