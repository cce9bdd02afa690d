"""One data-parallel rank of the fake train engine (run as a script by test_fake_train.py).

``python dp_worker.py RANK WORLD_SIZE PORT OUT``: trains two steps on this rank's shard of the shared
test batch and saves its metrics and final weights to ``OUT``.
"""

import sys

import torch
from rlcore.api import DistInfo, EngineSpec
from rlcore.builtin.devices import CPUPlatform
from rlcore.testing.contract import contract_batch, token_nll_loss
from rlcore.testing.fakes import FakeTrainConfig, FakeTrainEngine

SPEC = dict(model_path="", dtype="float64", lr=0.05, weight_decay=0.1, grad_clip=0.5, micro_batch_size=1)
CONFIG = dict(vocab_size=50, hidden_size=8)


def batch():
    return contract_batch(3, vocab_low=3, vocab_high=50, seed=2)


def main(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist = DistInfo(rank=rank, world_size=world, local_rank=0, master_port=port)
    engine = FakeTrainEngine(EngineSpec(**SPEC), FakeTrainConfig(**CONFIG), CPUPlatform(), dist)
    shard = batch().chunk(world)[rank]  # meta (global token count) is the whole batch's
    metrics = [engine.train_step(shard, token_nll_loss) for _ in range(2)]
    torch.save({"metrics": metrics, "params": engine.model.state_dict(), "rows": len(shard)}, out)
    engine.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
