"""Test set-up shared by the suites that run a tiny model in-process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """One torch (OpenMP) thread inside the block, the previous count restored after it. On a shared
    2-core machine torch's two threads spin against other processes and a tiny model's forward got
    ~25x slower; on one thread these tests stay quick."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
