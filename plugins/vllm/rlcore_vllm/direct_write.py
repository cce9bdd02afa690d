"""Writing a weight stream straight into vLLM's parameters, without vLLM's reload pass.

vLLM's in-place reload (``reload_weights``) rebuilds every module it touches: it moves the module's
parameters aside, runs its weight loaders and then its ``process_weights_after_loading``. For an
unquantized model on an NVIDIA GPU that processing does nothing, so a sync is really just copies, but the
reload pass costs 0.1-0.2 s for a 0.5B model against a copy floor of 0.3 ms. A :class:`WritePlan` maps
each Hugging Face weight name to the slice of the vLLM parameter it occupies (``q_proj`` -> rows
``[0, q)`` of ``qkv_proj``, ``up_proj`` -> the second half of ``gate_up_proj``, an embedding -> the
first ``vocab`` rows of a padded one), computed once from the live parameters, and :meth:`WritePlan.write`
copies a whole stream with one multi-tensor copy.

Only modules that vLLM would not process after loading may be written this way: the engine's worker
decides which (:func:`direct_writable`), and everything else goes through the reload. Fused
mixture-of-experts modules never are: their per-expert checkpoint tensors go through the reload, which
assembles them into the fused ``w13``/``w2`` weights (:func:`expert_containers`). The fused-module
order is vLLM's ``packed_modules_mapping`` order, the order its weight loaders use for an unsharded
(``tensor_parallel_size=1``) model; with tensor parallelism each worker holds a shard and the plan is not
used.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet

import torch

#: vLLM quantization methods whose ``process_weights_after_loading`` leaves weights as loaded on an
#: NVIDIA GPU (it repacks them on CPU, which is why the CPU build keeps the reload path).
UNPROCESSED_METHODS = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")


class WritePlan:
    """Hugging Face name -> the view of the vLLM parameter it is copied into.

    ``params``: vLLM's ``named_parameters()`` (tied parameters appear once). ``shapes``: the Hugging Face
    weights' full shapes. ``ties``: groups of Hugging Face names that are one tensor. ``packed``: vLLM's
    fused module -> the Hugging Face modules it holds, in order. ``writable``: the vLLM modules that may
    be written directly (default: all). ``experts``: vLLM's fused mixture-of-experts modules, never
    written directly.

    A name is planned when its target is found and the shapes agree; a vLLM module is planned only
    with every one of its weights, so :meth:`write` hands the reload whole modules.
    """

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        shapes: Mapping[str, Sequence[int]],
        ties: Iterable[Sequence[str]] = (),
        packed: Mapping[str, Sequence[str]] | None = None,
        writable: Iterable[str] | None = None,
        experts: Iterable[str] = (),
    ):
        packed = packed or {}
        allowed = None if writable is None else set(writable)
        experts = tuple(experts)
        containers = expert_containers(experts)
        views: dict[str, torch.Tensor] = {}
        for pname, param in params.items():
            module, _, leaf = pname.rpartition(".")
            if allowed is not None and module not in allowed:
                continue
            if any(module == e or module.startswith(f"{e}.") for e in experts):
                continue
            head, _, last = module.rpartition(".")
            prefix = f"{head}." if head else ""
            parts = [f"{prefix}{part}.{leaf}" for part in packed.get(last, ())] or [pname]
            if not all(name in shapes for name in parts):
                continue
            rows = [int(shapes[name][0]) if len(shapes[name]) else 0 for name in parts]
            tails = {tuple(shapes[name][1:]) for name in parts}
            if tails != {tuple(param.shape[1:])} or param.dim() == 0:
                continue
            # A fused parameter is exactly its parts stacked; a single one may be padded (vocab rows).
            if (len(parts) > 1 and sum(rows) != param.shape[0]) or sum(rows) > param.shape[0]:
                continue
            offset = 0
            for name, count in zip(parts, rows, strict=True):
                views[name] = param.data.narrow(0, offset, count)
                offset += count
        # A vLLM module is written whole or not at all: the reload must never get part of a module.
        members: dict[str, list[str]] = {}
        for name in shapes:
            members.setdefault(vllm_module_of(name, packed, containers), []).append(name)
        for names in members.values():
            if not all(name in views for name in names):
                for name in names:
                    views.pop(name, None)
        # Tied names: one copy into the first planned member is enough (vLLM shares the parameter).
        self.skipped: set[str] = set()
        for group in ties:
            planned = [name for name in group if name in views]
            if planned:
                self.skipped.update(name for name in group if name not in views)
        self.views = views

    def write(
        self, named: Iterable[tuple[str, torch.Tensor]], flush_bytes: int = 512 * 2**20
    ) -> list[tuple[str, torch.Tensor]]:
        """Copy every planned tensor of ``named`` into its parameter and return the pairs that are not
        planned, in order, for the reload path. Copies go out as one ``_foreach_copy_`` per device of the
        sources each time ``flush_bytes`` have gathered (the stream's tensors are released as it goes);
        on a device they are asynchronous: synchronize before freeing the sources."""
        rest: list[tuple[str, torch.Tensor]] = []
        pending: dict[torch.device, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        held = 0
        for name, tensor in named:
            view = self.views.get(name)
            if view is None:
                if name not in self.skipped:
                    rest.append((name, tensor))
                continue
            if view.shape != tensor.shape:
                raise ValueError(
                    f"weight {name!r} has shape {tuple(tensor.shape)}, the rollout model's is {tuple(view.shape)}"
                )
            dsts, srcs = pending.setdefault(tensor.device, ([], []))
            dsts.append(view)
            srcs.append(tensor)
            held += tensor.numel() * tensor.element_size()
            if held >= flush_bytes:
                _copy(pending)
                held = 0
        _copy(pending)
        return rest


def _copy(pending: dict[torch.device, tuple[list[torch.Tensor], list[torch.Tensor]]]) -> None:
    for dsts, srcs in pending.values():
        torch._foreach_copy_(dsts, srcs)
    pending.clear()


def vllm_module_of(
    name: str, packed: Mapping[str, Sequence[str]], containers: AbstractSet[str] = frozenset()
) -> str:
    """The vLLM module Hugging Face weight ``name`` loads into: ``model.layers.0.self_attn.k_proj.bias``
    -> ``model.layers.0.self_attn.qkv_proj``. An expert's weight of a fused mixture-of-experts layer
    (``containers``: :func:`expert_containers`) -> the layer's experts:
    ``model.layers.0.mlp.experts.3.up_proj.weight`` -> ``model.layers.0.mlp.experts`` (the name stands
    for vLLM's module of all the layer's experts; only the grouping matters)."""
    if containers:
        parts = name.split(".")
        for i in range(len(parts) - 2, 0, -1):
            if parts[i].isdigit():
                prefix = ".".join(parts[:i])
                if prefix in containers:
                    return prefix
    parent = name.rpartition(".")[0]
    head, _, last = parent.rpartition(".")
    for fused, parts in packed.items():
        if last in parts:
            return f"{head}.{fused}" if head else fused
    return parent


def expert_containers(fused_moe_modules: Iterable[str]) -> frozenset[str]:
    """Where Hugging Face names put an expert index in front of the weights that vLLM's fused
    mixture-of-experts modules ``fused_moe_modules`` hold.

    vLLM keeps all experts of a layer in one module (``model.layers.0.mlp.experts.routed_experts``, with
    ``w13_weight [E, 2I, H]`` and ``w2_weight [E, H, I]``); the checkpoint names each expert's tensors
    (``model.layers.0.mlp.experts.3.gate_proj.weight``). The name of the layer's experts is the prefix the
    two share up to that index; as vLLM's own module name may go on (``.routed_experts``), every prefix
    of it within its layer (after its last index) is a candidate, and a Hugging Face name belongs to
    the experts when one of them is followed by an index in it.
    """
    containers = set()
    for module in fused_moe_modules:
        parts = module.split(".")
        last_index = max((i for i, part in enumerate(parts) if part.isdigit()), default=-1)
        containers.update(".".join(parts[:j]) for j in range(last_index + 1, len(parts) + 1) if j > 0)
    return frozenset(containers)


def direct_writable(model: torch.nn.Module) -> set[str]:
    """Names of ``model``'s modules whose weights vLLM uses as loaded: a linear or embedding layer with an
    unquantized method, or a module without a quantization method (norms). Call only where the platform
    does no processing for those methods (NVIDIA GPUs)."""
    names = set()
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or type(method).__name__ in UNPROCESSED_METHODS:
            names.add(name)
    return names
