"""Pieces both fake engines share: model construction, release/resume bookkeeping, fixed costs."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from rlcore.testing.fake_config import TinyLMConfig
from rlcore.testing.tiny_lm import TinyLM, dtype_from_name, resolve_vocab_size


def default_platform(platform):
    """``platform``, or the CPU platform when none is given (tests build fakes without one)."""
    if platform is not None:
        return platform
    from rlcore.devices import get_platform

    return get_platform("cpu")


def build_model(cfg: TinyLMConfig, model_path: str, head: str, seed: int, dtype: str) -> TinyLM:
    """The TinyLM a fake engine with this config, model folder, head, seed and dtype runs."""
    vocab = resolve_vocab_size(cfg.vocab_size, model_path)
    return TinyLM(
        vocab, cfg.hidden_size, head=head, prev_token=cfg.prev_token, seed=seed, dtype=dtype_from_name(dtype)
    )


class Released:
    """Release/resume bookkeeping: which tags are off the device, and CPU copies of what they held."""

    def __init__(self, owner: str, allowed: tuple[str, ...]):
        self.owner, self.allowed = owner, allowed
        self.tags: set[str] = set()
        self.stash: dict[str, object] = {}

    def check(self, tags: Sequence[str]) -> list[str]:
        if isinstance(tags, str):
            tags = [tags]
        unknown = [t for t in tags if t not in self.allowed]
        if unknown:
            raise ValueError(f"{self.owner}: unknown release tag(s) {unknown}; allowed: {list(self.allowed)}")
        return list(tags)

    def require(self, what: str, *tags: str) -> None:
        missing = sorted(set(tags) & self.tags)
        if missing:
            raise RuntimeError(f"{self.owner}.{what}: {missing} released; call resume({missing}) first")


def offload_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copy parameters to the CPU and leave empty tensors in their place (frees device memory)."""
    stash = {}
    for name, p in model.named_parameters():
        stash[name] = p.data.to("cpu", copy=True)
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)
    return stash


def restore_params(model: torch.nn.Module, stash: dict[str, torch.Tensor], device: torch.device) -> None:
    """Undo :func:`offload_params`: the same parameter objects get their values back on ``device``."""
    for name, p in model.named_parameters():
        p.data = stash[name].to(device)


def spend(seconds: float) -> None:
    """The fixed cost of a call (``*_cost_s``): sleep, so a benchmark's fakes do not compete for CPUs."""
    if seconds > 0:
        time.sleep(seconds)
