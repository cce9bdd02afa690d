"""One receiver rank of the broadcast test, run as a separate process:
``python broadcast_worker.py RANK WORLD_SIZE PORT OUT.json [PLATFORM]`` (``cpu``: gloo; ``cuda``: NCCL,
this rank on GPU ``RANK``).

It follows the sender's script of syncs (see test_broadcast.py) and writes what it saw to OUT.json.
"""

import contextlib
import json
import sys

import streams  # next to this script
import torch
from rlcore.devices import get_platform
from rlcore.transports.broadcast import BroadcastTransport, WeightSenderFailed
from rlcore.transports.config import TransportConfig
from rlcore.weights import assemble


def main(rank: int, world_size: int, port: int, out: str, platform_name: str = "cpu") -> None:
    torch.set_num_threads(1)
    platform = get_platform(platform_name)
    platform.set_device(rank)
    transport = BroadcastTransport(TransportConfig(name="broadcast", timeout_s=120), platform)
    transport.init_group(rank, world_size, "127.0.0.1", port)
    seen = {"device": str(transport.device)}

    # sync 0: the whole stream, kept (clones: the received views are only ours until the next bucket).
    received = [[(n, t.clone()) for n, t in bucket] for bucket in transport.receive(None)]
    seen["fingerprint"] = streams.fingerprint(received)
    whole = list(assemble(received))
    expected = streams.named_tensors(0)
    seen["assembled_equal"] = [n for n, _ in whole] == [n for n, _ in expected] and all(
        a.dtype == b.dtype and torch.equal(a.cpu(), b) for (_, a), (_, b) in zip(whole, expected, strict=True)
    )
    seen["stats"] = transport.last_receive_stats

    # sync 1: stop after the first bucket; closing drains the rest so the sender can finish.
    with contextlib.closing(transport.receive(None)) as stream:
        seen["first_bucket_of_sync1"] = streams.fingerprint([next(stream)])

    # sync 2: the sender's exporter fails mid-stream.
    try:
        for _ in transport.receive(None):
            pass
        seen["abort"] = None
    except WeightSenderFailed as exc:
        seen["abort"] = str(exc)

    # sync 3: the group is still in step.
    seen["fingerprint_sync3"] = streams.fingerprint(
        [[(n, t.clone()) for n, t in bucket] for bucket in transport.receive(None)]
    )
    transport.close()
    with open(out, "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])
