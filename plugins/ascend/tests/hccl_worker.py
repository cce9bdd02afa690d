"""One receiver of the HCCL transport test, as a separate process:
``python hccl_worker.py RANK WORLD_SIZE PORT OUT.json``. Receives two syncs and writes what it saw."""

import json
import sys

import hccl_stand_in  # next to this script
import torch
from rlcore.transports.config import TransportConfig
from rlcore_ascend.transport import HCCLTransport


def main(rank: int, world_size: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    hccl_stand_in.install()
    transport = HCCLTransport(TransportConfig(name="hccl", timeout_s=120), hccl_stand_in.HCCLOnCPU())
    transport.init_group(rank, world_size, "127.0.0.1", port)
    seen = [
        hccl_stand_in.digest([[(n, t.clone()) for n, t in b] for b in transport.receive(None)])
        for _ in range(2)
    ]
    seen.append(transport.last_receive_stats)
    transport.close()
    with open(out, "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
