"""LoRA adapters on the Megatron engine: a low-rank update on megatron-core's tensor-parallel linears.

Megatron fuses what Hugging Face (and PEFT) keep apart, so an adapter lives on the fused layer:

============================  ===============================  ============================================
HF modules (PEFT targets)     Megatron layer (per TP rank)     adapter on this rank
============================  ===============================  ============================================
q_proj, k_proj, v_proj        ``linear_qkv``  column-parallel  ``A [3r, h]`` (whole), ``B [qkv/tp, 3r]``
o_proj                        ``linear_proj`` row-parallel     ``A [r, in/tp]``, ``B [h, r]`` (whole)
gate_proj, up_proj            ``linear_fc1``  column-parallel  ``A [2r, h]`` (whole), ``B [2F/tp, 2r]``
down_proj                     ``linear_fc2``  row-parallel     ``A [r, F/tp]``, ``B [h, r]`` (whole)
============================  ===============================  ============================================

Each HF projection gets its own adapter, as PEFT gives it, so that the engine trains what the FSDP engine
(PEFT) trains and the rollout loads exactly that: a fused layer of ``k`` projections holds their ``A`` s
stacked, ``A [k r, in]``, and ``B [out, k r]`` whose rows of projection ``j`` (laid out as ``W``'s: the
query-group interleave of ``linear_qkv``, ``[gate_r; up_r]`` of ``linear_fc1``, :mod:`rlcore_megatron.convert`)
use only columns ``j r .. (j+1) r``: a fixed block mask ``M`` makes the rest zero, so the layer computes
``W x + (alpha / r) * (B * M) (A x)``, which is ``W_j x + (alpha / r) B_j A_j x`` for each projection ``j``.
The masked entries get no gradient and stay zero. A projection that is not targeted
(``target_modules: [q_proj, v_proj]``) has its rows of ``M`` zero and is not exported.

Tensor parallelism, as megatron-core's own layers do it (no sequence parallelism):

- column-parallel: every rank has the whole input and ``A``; ``A x`` gets its gradient summed over the
  TP ranks in the backward (each rank's ``B`` rows contribute a part), so ``A``'s gradient and the input's
  gradient from the adapter are whole and equal on every rank;
- row-parallel: each rank has its slice of the input and of ``A``; ``A x`` is summed over the ranks in the
  forward (megatron-core's ``reduce_from_tensor_model_parallel_region``) and ``B`` (whole) applies to it.

Checkpoints (megatron-core's distributed format) store ``lora_A`` / ``lora_B`` with the split dimension
of the rank's part (:func:`_sharded_state_dict`).
"""

from __future__ import annotations

import contextlib
import math
import types
import zlib
from collections.abc import Callable, Iterator

import attrs
import torch
import torch.nn.functional as F
from megatron.core import parallel_state as mpu
from megatron.core import tensor_parallel
from rlcore.adapters import adapter_name
from rlcore.api import LoraSpec

from rlcore_megatron.architecture import ModelShape
from rlcore_megatron.convert import ParamMap, shard, to_mcore
from rlcore_megatron.hf_io import local_to_global

#: Megatron layer under ``decoder.layers.<i>.`` -> (split, fused kind, its HF projections in fused order,
#: the HF block holding them).
_LAYERS = {
    "self_attention.linear_qkv": ("column", "qkv", ("q_proj", "k_proj", "v_proj"), "self_attn"),
    "self_attention.linear_proj": ("row", "copy", ("o_proj",), "self_attn"),
    "mlp.linear_fc1": ("column", "gate_up", ("gate_proj", "up_proj"), "mlp"),
    "mlp.linear_fc2": ("row", "copy", ("down_proj",), "mlp"),
}
#: PEFT's name for every linear layer but the output layer (``LoraSpec``'s default).
ALL_LINEAR = "all-linear"
#: Every projection the engine can adapt (``all-linear``): the output layer is not one (as in PEFT).
PROJECTIONS = tuple(p for _, _, projections, _ in _LAYERS.values() for p in projections)


@attrs.frozen
class Adapted:
    """One adapted Megatron layer: its global name (``decoder.layers.3.mlp.linear_fc1``), how it is split
    (``column``/``row``), its fused kind (``qkv``, ``gate_up``, ``copy``), the HF projections it holds
    and which of them are targeted, and its HF module prefix (``model.layers.3.mlp``)."""

    name: str
    split: str
    kind: str
    projections: tuple[str, ...]
    targeted: tuple[str, ...]
    hf_prefix: str
    layer: int


def targeted_projections(spec: LoraSpec) -> tuple[str, ...]:
    """The HF projections ``spec.target_modules`` names, or a clear error for names the engine cannot
    adapt."""
    targets = spec.target_modules
    if targets == ALL_LINEAR:
        return PROJECTIONS
    names = (targets,) if isinstance(targets, str) else tuple(targets)
    unknown = [n for n in names if n not in PROJECTIONS]
    if unknown:
        raise ValueError(
            f"actor.lora.target_modules={list(names)!r}: the megatron engine adapts the decoder's linear "
            f"layers by their Hugging Face names ({', '.join(PROJECTIONS)}) or all-linear; it cannot adapt "
            f"{unknown}"
        )
    return tuple(p for p in PROJECTIONS if p in names)


def check_supported(spec: LoraSpec, shape: ModelShape, *, sequence_parallel: bool, impl: str) -> None:
    """Refuse, naming the setting, what the adapters do not cover."""
    if spec.dropout:
        raise ValueError(
            f"actor.lora.dropout={spec.dropout}: the megatron engine's adapters have no dropout (each "
            "tensor-parallel rank would drop different inputs of a shared A); set actor.lora.dropout: 0"
        )
    if shape.experts is not None:
        raise ValueError(
            "actor.lora with a mixture of experts: the megatron engine adapts dense decoders only; train the "
            "adapter with --engine fsdp, or set actor.lora.rank: 0"
        )
    if sequence_parallel:
        raise ValueError(
            "actor.lora with megatron.sequence_parallel: true: the adapters support tensor parallelism "
            "without sequence parallelism; set megatron.sequence_parallel: false"
        )
    if impl != "local":
        raise ValueError(
            f"actor.lora with megatron.transformer_impl={impl!r}: the adapters wrap megatron-core's local "
            "layers; set megatron.transformer_impl: local"
        )


def _seed(seed: int, name: str) -> int:
    """A seed per layer, from the run's and the layer's global name: the same ``A`` on every layout."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def _init_a(rank: int, fan_in: int, seed: int, name: str) -> torch.Tensor:
    """The whole ``A [rank, fan_in]``, uniform in ``±1/sqrt(fan_in)`` (PEFT's default, kaiming-uniform
    with ``a = sqrt(5)``)."""
    gen = torch.Generator().manual_seed(_seed(seed, name))
    bound = 1.0 / math.sqrt(fan_in)
    return (torch.rand(rank, fan_in, generator=gen, dtype=torch.float64) * 2 - 1) * bound


class _Switch:
    """Whether the adapters compute: off, the frozen base model does (``base_log_probs``)."""

    def __init__(self) -> None:
        self.on = True


def _masked_b(module) -> torch.Tensor:
    """The layer's ``B`` as it applies: ``B * M`` for a fused layer (the block mask), ``B`` otherwise."""
    return module.lora_B if module.lora_mask is None else module.lora_B * module.lora_mask


def _adapted_forward(module, switch: _Switch, scale: float, combine):
    """The layer's forward plus ``scale * B combine(A x)``: ``combine`` is the tensor-parallel step of
    ``A x`` (the gradient's sum for a column-parallel layer, the forward's sum for a row-parallel one),
    the identity at TP=1."""
    base = module.forward

    def forward(self, input_, *args, **kwargs):
        out, bias = base(input_, *args, **kwargs)
        if not switch.on:
            return out, bias
        h = combine(F.linear(input_, self.lora_A))
        return out + scale * F.linear(h, _masked_b(self)), bias

    return types.MethodType(forward, module)


def _combine(split: str, tp: int):
    if tp == 1:
        return lambda h: h
    if split == "column":
        from rlcore_megatron.vocab_parallel import sum_grad_over_group

        return lambda h: sum_grad_over_group(h, mpu.get_tensor_model_parallel_group())
    return tensor_parallel.reduce_from_tensor_model_parallel_region


def _sharded_state_dict(module, axes: dict[str, int]):
    """megatron-core's ``sharded_state_dict`` of the layer with its adapter's split dimension added (its
    own would store a rank's part of ``lora_B`` as if every rank held the same tensor)."""
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        state = self.state_dict(prefix="", keep_vars=True)
        return make_sharded_tensors_for_checkpoint(
            state,
            prefix,
            axes,
            sharded_offsets,
            tp_group=self.tp_group,
            dp_cp_group=(metadata or {}).get("dp_cp_group"),
        )

    return types.MethodType(sharded_state_dict, module)


class Adapters:
    """The adapters of one pipeline stage: built by :meth:`add`, switched off and on by :meth:`disabled`,
    and read out as merged weights (:meth:`merged_value`) or adapter tensors (:meth:`maps`)."""

    def __init__(self, spec: LoraSpec, layers: list[Adapted], modules: dict[str, torch.nn.Module]):
        self.spec = spec
        self.layers = layers  # this stage's, in order
        self.modules = modules  # global layer name -> the Megatron linear
        self.switch = _Switch()

    @classmethod
    def add(
        cls,
        model: torch.nn.Module,
        spec: LoraSpec,
        shape: ModelShape,
        *,
        layer_offset: int,
        tp_rank: int,
        tp_size: int,
        seed: int,
        dtype: torch.dtype,
    ) -> Adapters:
        """Freeze every parameter of ``model`` (this stage) and add an adapter to each targeted layer."""
        targeted = targeted_projections(spec)
        model.requires_grad_(False)
        modules = {local_to_global(n, layer_offset): m for n, m in model.named_modules()}
        layers, found = [], {}
        adapters = cls(spec, layers, found)
        for name in sorted(modules, key=_layer_order):
            parts = name.split(".")
            if len(parts) < 4 or parts[0] != "decoder" or parts[1] != "layers":
                continue
            suffix = ".".join(parts[3:])
            if suffix not in _LAYERS:
                continue
            split, kind, projections, hf_block = _LAYERS[suffix]
            chosen = tuple(p for p in projections if p in targeted)
            if not chosen:
                continue
            layer = int(parts[2])
            adapted = Adapted(
                name, split, kind, projections, chosen, f"model.layers.{layer}.{hf_block}", layer
            )
            adapters._attach(modules[name], adapted, shape, tp_rank, tp_size, seed, dtype)
            layers.append(adapted)
            found[name] = modules[name]
        if not layers and any(n.startswith("decoder.layers.") for n in modules):
            raise ValueError(f"actor.lora.target_modules={spec.target_modules!r} matched no layer")
        return adapters

    def _attach(self, module, adapted: Adapted, shape, tp_rank, tp_size, seed, dtype) -> None:
        weight = module.weight  # [out/tp, in] (column) or [out, in/tp] (row)
        r = self.spec.rank
        if adapted.split == "column":
            k = len(adapted.projections)
            a = torch.cat(
                [_init_a(r, weight.shape[1], seed, f"{adapted.name}.{p}") for p in adapted.projections]
            )
            b = torch.zeros(weight.shape[0], k * r, dtype=torch.float64)
            # Projection j's rows of W use columns j r .. (j+1) r of B, where j is targeted.
            pm = ParamMap(adapted.name, adapted.projections, adapted.kind, 0, adapted.layer)
            blocks = []
            for j, p in enumerate(adapted.projections):
                block = torch.zeros(_rows(shape, p), k * r, dtype=torch.float64)
                if p in adapted.targeted:
                    block[:, j * r : (j + 1) * r] = 1.0
                blocks.append(block)
            mask = shard(pm, to_mcore(pm, blocks, shape), tp_rank, tp_size).to(dtype)
            axes = {"weight": 0, "bias": 0, "lora_B": 0}
        else:
            full = _init_a(r, weight.shape[1] * tp_size, seed, f"{adapted.name}.{adapted.projections[0]}")
            a = full.chunk(tp_size, dim=1)[tp_rank].contiguous()
            b = torch.zeros(weight.shape[0], r, dtype=torch.float64)
            mask = None
            axes = {"weight": 1, "lora_A": 1}
        module.lora_A = torch.nn.Parameter(a.to(dtype))
        module.lora_B = torch.nn.Parameter(b.to(dtype))
        # Not in the state dict: rebuilt from the config at every start.
        module.register_buffer("lora_mask", mask, persistent=False)
        split = module.lora_B if adapted.split == "column" else module.lora_A
        tensor_parallel.set_tensor_model_parallel_attributes(
            split, True, 0 if adapted.split == "column" else 1, 1
        )
        module.forward = _adapted_forward(
            module, self.switch, self.spec.scale, _combine(adapted.split, tp_size)
        )
        module.sharded_state_dict = _sharded_state_dict(module, axes)

    # -- the adapter's uses --------------------------------------------------------------------------
    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """A context in which the frozen base model computes."""
        self.switch.on = False
        try:
            yield
        finally:
            self.switch.on = True

    def merged_value(self) -> Callable[[str, torch.Tensor], torch.Tensor]:
        """``(global name, param) -> tensor``: an adapted layer's weight as ``W + scale * B A`` on this
        rank's part, computed in fp32 (then cast once, by the caller); other parameters as they are."""
        weights = {f"{a.name}.weight": self.modules[a.name] for a in self.layers}
        scale = self.spec.scale

        def value(name: str, param: torch.Tensor) -> torch.Tensor:
            module = weights.get(name)
            if module is None:
                return param.detach()
            b = _masked_b(module).detach().float()
            return param.detach().float() + scale * (b @ module.lora_A.detach().float())

        return value

    def maps(self) -> list[ParamMap]:
        """The adapter's tensors as :class:`ParamMap` s from Megatron's names (``<layer>.lora_A``) to HF's
        (``<module>.lora_A.weight``): a fused layer's stacked ``A`` split into its projections' blocks
        (kind ``stack``), its ``B`` split into the projections' rows as ``W`` is (their column blocks are
        cut by :meth:`exported`)."""
        maps = []
        for a in self.layers:
            hf = [f"{a.hf_prefix}.{p}" for p in a.projections]
            a_names = tuple(adapter_name(m, "A") for m in hf)
            b_names = tuple(adapter_name(m, "B") for m in hf)
            if a.split == "column":
                maps.append(ParamMap(f"{a.name}.lora_A", a_names, "stack", None, a.layer))
                maps.append(ParamMap(f"{a.name}.lora_B", b_names, a.kind, 0, a.layer))
            else:
                maps.append(ParamMap(f"{a.name}.lora_A", a_names, "copy", 1, a.layer))
                maps.append(ParamMap(f"{a.name}.lora_B", b_names, "copy", None, a.layer))
        return maps

    def exported(self, named: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The adapter stream of :meth:`maps` in PEFT's shapes: each fused projection's ``B`` cut to its own
        column block ``[rows, r]``, and the untargeted projections left out."""
        r = self.spec.rank
        block: dict[str, int | None] = {}
        for a in self.layers:
            for j, p in enumerate(a.projections):
                if p in a.targeted:
                    module = f"{a.hf_prefix}.{p}"
                    block[adapter_name(module, "A")] = None
                    block[adapter_name(module, "B")] = j if a.split == "column" else None
        for name, tensor in named:
            if name not in block:
                continue
            j = block[name]
            yield name, tensor if j is None else tensor[:, j * r : (j + 1) * r].contiguous()


def _rows(shape: ModelShape, projection: str) -> int:
    """Rows of an HF projection's weight: ``q_proj`` ``H d``, ``k_proj``/``v_proj`` ``G d``, ``gate_proj`` and
    ``up_proj`` ``F``."""
    if projection == "q_proj":
        return shape.num_heads * shape.head_dim
    if projection in ("k_proj", "v_proj"):
        return shape.num_kv_heads * shape.head_dim
    return shape.ffn_hidden_size


def _layer_order(name: str) -> tuple:
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "decoder" and parts[1] == "layers" and parts[2].isdigit():
        return (0, int(parts[2]), name)
    return (1, 0, name)
