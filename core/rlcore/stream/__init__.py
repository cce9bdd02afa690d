"""Rollouts that outlive a step: requests in flight across steps, groups taken as they finish
(``trainer.mode: stream``, docs/async.md). :class:`RolloutStream` runs the rounds and the cut;
:mod:`rlcore.stream.policies` holds the selection policies (a plugin axis)."""

from rlcore.stream.policies import StreamPolicy
from rlcore.stream.stream import STREAM_FILE, RolloutStream, read_stream

__all__ = ["STREAM_FILE", "RolloutStream", "StreamPolicy", "read_stream"]
