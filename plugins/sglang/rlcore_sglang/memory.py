"""Which device memory is released, by tag, and what that allows (no sglang: testable on CPU).

rlcore's rollout tags are ``weights`` and ``kv_cache``. SGLang releases its memory by the same tags
(``release_memory_occupation(tags=...)``, through ``torch_memory_saver``), one by one, plus
``cuda_graph`` for the buffers its CUDA graphs replay into. SGLang itself keeps no guard: resuming a
tag it did not release, or releasing one twice, fails an assertion inside its scheduler process and
takes the engine down. So :class:`MemoryTags` decides what to send and refuses what would break:

- ``cuda_graph`` travels with ``kv_cache`` (both are needed only while generating), when graphs exist;
- a tag already released (or already resident) is not sent again;
- generating needs every tag resident; loading weights needs ``weights`` resident (the KV cache may
  stay released: the colocated order is ``resume(["weights"])``, ``load_weights``, ``resume(["kv_cache"])``);
- without a host copy of the weights (``sglang.weights_cpu_backup: false``) resumed weights hold
  whatever the memory held, so generating is refused until a weight load.

>>> tags = MemoryTags(memory_saver=True, weights_backup=False, cuda_graph=True)
>>> tags.release(["kv_cache", "weights"])
['weights', 'kv_cache', 'cuda_graph']
>>> tags.resume(["weights"])
['weights']
>>> tags.loaded()
>>> tags.resume(["kv_cache", "weights"])
['kv_cache', 'cuda_graph']
>>> tags.check_generate()
"""

from __future__ import annotations

from collections.abc import Sequence

from rlcore.api import ROLLOUT_TAGS, check_tags

#: rlcore's tags (``rlcore.api.ROLLOUT_TAGS``), in the order SGLang is asked to release them.
RELEASE_TAGS = ROLLOUT_TAGS
CUDA_GRAPH = "cuda_graph"


class MemoryTags:
    """Release/resume bookkeeping of one engine.

    ``memory_saver``: SGLang runs with ``enable_memory_saver`` (else nothing is freed, and
    :meth:`release`/:meth:`resume` return the bookkeeping only: ``sends`` is false). ``weights_backup``:
    SGLang keeps a host copy of released weights. ``cuda_graph``: SGLang captured CUDA graphs.
    """

    def __init__(self, *, memory_saver: bool, weights_backup: bool, cuda_graph: bool):
        self.sends = memory_saver
        self.weights_backup = weights_backup
        self.cuda_graph = cuda_graph and memory_saver
        self.released: set[str] = set()
        #: Resumed without a host copy: the weights must be loaded before the engine generates.
        self.weights_stale = False

    def release(self, tags: Sequence[str]) -> list[str]:
        """Record ``tags`` as released; return the SGLang tags to release now (maybe none)."""
        new = [t for t in check_tags(tags, engine="sglang") if t not in self.released]
        self.released.update(new)
        return self._sglang(new)

    def resume(self, tags: Sequence[str]) -> list[str]:
        """Record ``tags`` as resident again; return the SGLang tags to resume now (maybe none)."""
        back = [t for t in check_tags(tags, engine="sglang") if t in self.released]
        self.released.difference_update(back)
        if "weights" in back and self.sends and not self.weights_backup:
            self.weights_stale = True
        return self._sglang(back)

    def _sglang(self, tags: list[str]) -> list[str]:
        if not self.sends:
            return []
        return tags + ([CUDA_GRAPH] if self.cuda_graph and "kv_cache" in tags else [])

    def loaded(self) -> None:
        """A full weight load finished: the weights are the caller's again."""
        self.weights_stale = False

    def check_generate(self) -> None:
        """Raise unless the engine may generate now, saying what to call first."""
        if self.released:
            raise RuntimeError(
                f"sglang rollout: {sorted(self.released)} released; call resume({sorted(self.released)}) "
                f"before generating"
            )
        if self.weights_stale:
            raise RuntimeError(
                "sglang rollout: the weights were resumed without a host copy "
                "(sglang.weights_cpu_backup: false) and hold no model yet; call load_weights before "
                "generating"
            )

    def check_load(self) -> None:
        """Raise unless weights may be loaded now (their memory must be resident)."""
        if "weights" in self.released:
            raise RuntimeError(
                "sglang rollout: weights are released; call resume(['weights']) before load_weights"
            )
