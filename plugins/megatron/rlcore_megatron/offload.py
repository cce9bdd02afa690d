"""Moving engine state off the device and back, for colocation with a rollout engine.

Megatron's DDP keeps parameters and gradients as views into a few flat buffers, and its optimizers
hold references to those views and to their own state tensors. So nothing is re-assigned: each
storage is copied to host memory and its device storage shrunk to zero bytes; ``unpark`` regrows it
and copies back, and every view and optimizer reference is valid again.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import torch


@attrs.define
class _Parked:
    whole: torch.Tensor  # uint8 view of the entire storage
    nbytes: int
    host: torch.Tensor | None


class Parking:
    """Storages moved off the device, by tag (``weights``, ``grads``, ``optimizer``)."""

    def __init__(self) -> None:
        self._parked: dict[str, list[_Parked]] = {}

    def is_parked(self, tag: str) -> bool:
        return tag in self._parked

    def park(self, tag: str, tensors: Iterable[torch.Tensor], keep_values: bool = True) -> None:
        """Free the device storage behind each tensor; keep a host copy unless ``keep_values`` is
        False (gradient buffers are zeroed before use, so they need none). Idempotent per tag."""
        if tag in self._parked:
            return
        parked, seen = [], set()
        for t in tensors:
            storage = t.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            # The whole storage, not just this view: other views into the same buffer come back too.
            whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
            host = None
            if keep_values:
                # Pinned host memory makes the copy back fast; a CPU "device" has nothing to pin.
                host = torch.empty(whole.shape, dtype=torch.uint8, pin_memory=t.device.type != "cpu")
                host.copy_(whole)
            parked.append(_Parked(whole, storage.nbytes(), host))
        for p in parked:
            p.whole.untyped_storage().resize_(0)
        self._parked[tag] = parked

    def unpark(self, tag: str) -> None:
        """Regrow the storages parked under ``tag``; restore their values (zeros where none were kept)."""
        for p in self._parked.pop(tag, []):
            p.whole.untyped_storage().resize_(p.nbytes)
            if p.host is None:
                p.whole.zero_()
            else:
                p.whole.copy_(p.host)
