"""Pipeline hand-offs whose shapes every stage already knows.

Micro-batches differ in length, so megatron-core's pipeline schedule runs with ``variable_seq_lengths``:
before each hand-off of activations (forward) or their gradients (backward) the two stages exchange the
tensor's shape, then ``torch.cuda.synchronize()`` and read it back to the host (``tolist``): a device
sync at every hand-off (megatron-core 0.16-0.19). Every stage of a data-parallel group holds the same
micro-batches (the controller shards a step over data-parallel ranks only), so each stage can compute
every shape itself: :func:`known_shapes` answers megatron-core's shape exchange from that plan without
communicating.

The plan relies on the order of megatron-core's non-interleaved schedules (1F1B and forward-only, the
ones this engine runs): forward hand-offs carry micro-batches 0, 1, 2, ... in turn, and so do backward
ones, and an activation's gradient has the activation's shape.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

#: ``(sequence, batch, hidden)``: a hand-off's shape in megatron-core's ``[s, b, h]`` layout.
Shape = tuple[int, int, int]


@contextlib.contextmanager
def known_shapes(shapes: Sequence[Shape]) -> Iterator[None]:
    """Inside, megatron-core's pipeline stages take the ``i``-th received activation's (and the ``i``-th
    received gradient's) shape from ``shapes[i]``, one per micro-batch in schedule order, instead of
    exchanging it. Every stage must enter it with the same ``shapes``."""
    received = {"forward": 0, "backward": 0}

    def next_shape(direction: str) -> list[int]:
        i = received[direction]
        if i >= len(shapes):
            raise RuntimeError(
                f"pipeline schedule received a {direction} tensor for micro-batch {i}, but the step has "
                f"{len(shapes)}: the schedule is not one of the non-interleaved ones this plan assumes"
            )
        received[direction] = i + 1
        return list(shapes[i])

    def communicate_shapes(self, tensor_send_next, tensor_send_prev, recv_prev, recv_next):
        # megatron-core's contract: [0, 0, 0] for a direction that receives nothing.
        prev = next_shape("forward") if recv_prev else [0, 0, 0]
        following = next_shape("backward") if recv_next else [0, 0, 0]
        return prev, following

    exchange = P2PCommunicator._communicate_shapes
    P2PCommunicator._communicate_shapes = communicate_shapes
    try:
        yield
    finally:
        P2PCommunicator._communicate_shapes = exchange


def handoff_shape(input_ids_shape: Sequence[int], hidden: int, sequence_shards: int = 1) -> Shape:
    """The hidden states a stage hands on for model input ``input_ids [b, s]`` (``[1, T]`` packed):
    ``(s / sequence_shards, b, hidden)``; ``sequence_shards`` is the tensor-parallel size under sequence
    parallelism (each rank holds a slice of the sequence), else 1."""
    b, s = input_ids_shape
    return (s // sequence_shards, b, hidden)
