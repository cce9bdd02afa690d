"""Shared fixtures of rlcore-fsdp's tests."""

import sys
from pathlib import Path

import pytest
import torch.distributed as dist

# fsdp_support / fsdp_dist_worker are imported by name, here and in the ranks torch.multiprocessing
# spawns (a spawned child starts with its parent's sys.path).
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True, scope="module")
def _process_group_per_module():
    """Engines built in the test process create a one-rank process group; tear it down after each
    module so no other test module (of any package in the same session) inherits it."""
    existed = dist.is_initialized()
    yield
    if not existed and dist.is_initialized():
        dist.destroy_process_group()
