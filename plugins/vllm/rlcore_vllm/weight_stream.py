"""Turning a weight stream into what vLLM's in-place reload can take safely.

vLLM reloads weights module by module (``reload_weights(..., is_checkpoint_format=True)``): a module
whose every weight arrived is rebuilt from them, one that got none keeps its weights, and one that got
only some (say ``q_proj`` of the fused ``qkv_proj``, or a weight without its bias) is rebuilt with
uninitialised memory for the rest. A name vLLM does not know raises inside that reload, with modules
already moved to the meta device. So before anything reaches vLLM, :class:`StreamFilter`

- checks every tensor's name and shape against the Hugging Face model the engine serves,
- holds tensors back until their vLLM module is complete, so a module is updated whole or not at all,
- sends tied weights under every name they are tied to: with ``tie_word_embeddings`` vLLM-CPU keeps a
  packed copy of the output layer that only ``lm_head.weight`` refreshes (FINDINGS.md),
- and never raises into vLLM: a bad tensor ends the stream early and the error is raised afterwards.

Names are grouped into vLLM modules by their parent module, with the parts of fused modules
(``packed_modules_mapping``, e.g. ``qkv_proj: [q_proj, k_proj, v_proj]``) mapped to the fused name. A
mixture-of-experts layer is one vLLM module holding every expert (``w13_weight [E, 2I, H]``,
``w2_weight [E, H, I]``), loaded from the checkpoint's per-expert tensors
(``model.layers.0.mlp.experts.{e}.{gate,up,down}_proj.weight``; Mixtral's
``block_sparse_moe.experts.{e}.{w1,w3,w2}.weight``): all of a layer's expert tensors form one group
(:func:`rlcore_vllm.direct_write.expert_containers`), held back until every expert arrived. The stream
carries checkpoint names and layouts (:class:`rlcore.weights.CheckpointFormat`), not transformers'
fused in-memory experts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import attrs
import torch
from rlcore.api import WeightBucket
from rlcore.weights import WeightLayout, assemble

from rlcore_vllm.direct_write import expert_containers, vllm_module_of


class WeightStreamError(ValueError):
    """A weight stream did not fit the model. ``loaded`` names the modules updated before the error
    (every other module keeps its previous weights)."""

    def __init__(self, message: str, loaded: tuple[str, ...] = ()):
        super().__init__(message)
        self.loaded = loaded


@attrs.define(frozen=True)
class ModelWeights:
    """The weights a rollout model accepts, in Hugging Face names.

    ``layout``: names, full shapes and ties (:class:`rlcore.weights.WeightLayout`). ``packed``: vLLM's
    fused module name -> the Hugging Face module names it holds. ``experts``: vLLM's fused
    mixture-of-experts modules (``model.layers.0.mlp.experts.routed_experts``), each loaded from all of
    its layer's expert tensors.
    """

    layout: WeightLayout
    packed: Mapping[str, tuple[str, ...]]
    experts: tuple[str, ...] = ()
    # Computed once: a sync looks every name up (~290 for a 0.5B model), and redoing the string work
    # per load was half the stream filter's time (1.5 -> 0.67 ms for 0.5B on an H100 host).
    _containers: frozenset[str] = attrs.field(init=False, repr=False, eq=False)
    _module: Mapping[str, str] = attrs.field(init=False, repr=False, eq=False)
    _members: Mapping[str, frozenset[str]] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_containers", expert_containers(self.experts))
        module = {name: vllm_module_of(name, self.packed, self._containers) for name in self.layout.shapes}
        groups: dict[str, set[str]] = {}
        for name, mod in module.items():
            groups.setdefault(mod, set()).add(name)
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_members", {mod: frozenset(names) for mod, names in groups.items()})

    @classmethod
    def from_pretrained(
        cls, model_path: str, packed: Mapping[str, Iterable[str]], experts: Iterable[str] = ()
    ) -> ModelWeights:
        """Names, shapes and ties from the checkpoint's config (:class:`rlcore.weights.WeightLayout`)."""
        layout = WeightLayout.from_pretrained(model_path)
        return cls(layout, {k: tuple(v) for k, v in packed.items()}, tuple(experts))

    def module_of(self, name: str) -> str:
        """The vLLM module that ``name`` loads into: ``model.layers.0.self_attn.k_proj.bias`` ->
        ``model.layers.0.self_attn.qkv_proj``, ``model.layers.0.mlp.experts.3.up_proj.weight`` ->
        ``model.layers.0.mlp.experts`` (standing for the layer's fused experts)."""
        module = self._module.get(name)
        return module if module is not None else vllm_module_of(name, self.packed, self._containers)

    def members(self) -> Mapping[str, frozenset[str]]:
        """vLLM module -> the names it needs, all of them, before it can be rebuilt."""
        return self._members

    def check(self, name: str, tensor: torch.Tensor) -> None:
        """Raise :class:`WeightStreamError` unless ``name`` is a weight of this model with this shape."""
        message = self.layout.mismatch(name, tensor)
        if message is not None:
            raise WeightStreamError(message)


class StreamFilter:
    """Iterate ``buckets`` as whole-module ``(name, tensor)`` pairs fit for vLLM; see the module doc.

    Use as an iterator handed to vLLM, then call :meth:`raise_if_failed`. Tensors are cast to ``dtype``.
    Memory: only tensors of modules still incomplete are held (a few, for streams in model order).
    """

    def __init__(self, weights: ModelWeights, buckets: Iterable[WeightBucket], dtype: torch.dtype):
        self.weights, self.buckets, self.dtype = weights, buckets, dtype
        self._members = weights.members()
        self.error: BaseException | None = None
        self.loaded: list[str] = []  # modules handed over in full, in order
        self.incomplete: dict[str, list[str]] = {}  # module -> names still missing at the end

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        held: dict[str, dict[str, torch.Tensor]] = {}
        seen: set[str] = set()  # names received, or sent on behalf of a tied name
        received: set[str] = set()
        tied_values: dict[tuple[str, ...], tuple[str, torch.Tensor]] = {}  # first value of each tie group
        try:
            for name, tensor in assemble(self.buckets):
                self.weights.check(name, tensor)
                if name in received:
                    raise WeightStreamError(f"weight stream sent {name!r} twice")
                received.add(name)
                if tensor.dtype != self.dtype:
                    tensor = tensor.to(self.dtype)
                tied = self.weights.layout.ties.get(name)
                if tied is not None:
                    first = tied_values.setdefault(tied, (name, tensor))
                    if not torch.equal(first[1], tensor.to(first[1].device)):
                        raise WeightStreamError(
                            f"the rollout model ties {first[0]!r} and {name!r} (one tensor), but the weight "
                            f"stream sent different values for them; does the trainer untie embeddings "
                            f"(tie_word_embeddings) while the rollout model ties them?"
                        )
                for alias in tied or (name,):
                    if alias in seen:
                        continue  # already sent under another of its tied names
                    seen.add(alias)
                    module = self.weights.module_of(alias)
                    group = held.setdefault(module, {})
                    group[alias] = tensor
                    if len(group) == len(self._members[module]):
                        yield from held.pop(module).items()
                        self.loaded.append(module)
        except Exception as exc:  # raised inside vLLM's loading loop, it would leave modules on meta
            self.error = exc
        finally:
            close = getattr(self.buckets, "close", None)
            if close is not None:
                close()  # a transport drains what is left, so its sender is not left blocked
        self.incomplete = {
            module: sorted(self._members[module] - set(group)) for module, group in held.items()
        }

    def raise_if_failed(self) -> None:
        """After the stream was consumed: raise what went wrong, saying what was and was not loaded."""
        done = (
            f"{len(self.loaded)} modules before it were loaded (every other module keeps its old weights; "
            f"send a complete stream to make the model consistent again)"
            if self.loaded
            else "nothing was loaded"
        )
        if isinstance(self.error, WeightStreamError):
            raise WeightStreamError(f"{self.error} -- {done}", tuple(self.loaded)) from self.error
        if self.error is not None:
            raise WeightStreamError(
                f"the weight stream failed while being read ({type(self.error).__name__}: {self.error}) -- "
                f"{done}",
                tuple(self.loaded),
            ) from self.error
        if self.incomplete:
            parts = [
                f"{module} (missing {', '.join(missing)})" for module, missing in self.incomplete.items()
            ]
            shown = "; ".join(parts[:3]) + (f"; and {len(parts) - 3} more" if len(parts) > 3 else "")
            raise WeightStreamError(
                f"weight stream ended with modules only partly sent, which vLLM cannot rebuild: {shown}. "
                f"Those modules were not loaded and keep their old weights; the other "
                f"{len(self.loaded)} were loaded. Send every weight of a module together.",
                tuple(self.loaded),
            )
