"""Worker processes for ``test_mlp.py``: megatron-core's dense ``MLP`` against :class:`SplitGateUpMLP`.

Each worker builds both MLPs directly (no engine) on gloo with megatron-core's tensor-parallel groups, in
float64, from one set of full weights sharded as ``rlcore_megatron.convert`` shards them, runs a forward
and a backward of ``sum(out * dout)`` through each variant, and saves outputs and gradients (this rank's
parts) next to a plain float64 reference computed on the full tensors.
"""

from __future__ import annotations

from pathlib import Path

#: Sequence, batch, hidden and MLP width (full: each of ``tp`` ranks holds ``F / tp`` of gate and up).
S, B, H, F = 8, 2, 16, 24


def _reference(x, dout, w_gate, w_up, w_down):
    """``out`` and the gradients of ``sum(out * dout)`` for x and the full weights, plain autograd."""
    import torch.nn.functional as F_

    leaves = [t.clone().requires_grad_(True) for t in (x, w_gate, w_up, w_down)]
    xr, g, u, d = leaves
    out = (F_.silu(xr @ g.t()) * (xr @ u.t())) @ d.t()
    (out * dout).sum().backward()
    return out.detach(), *(t.grad for t in leaves)


def _run(mlp, x, dout, recompute=False):
    """``mlp``'s output and the gradients of ``sum(out * dout)``: ``(out, dx, d linear_fc1, d linear_fc2)``."""
    from megatron.core import tensor_parallel
    from megatron.core.pipeline_parallel.schedules import custom_backward

    x = x.clone().requires_grad_(True)
    if recompute:  # as TransformerBlock's recompute_granularity="full" calls each layer
        out, bias = tensor_parallel.checkpoint(mlp, False, x)
    else:
        out, bias = mlp(x)
    assert bias is None
    # As the engine's schedule runs the backward (megatron-core's custom_backward: the C++ engine itself).
    # Tensor.backward would go through the CPU redirect's torch-function mode, which is off while its
    # handler runs: megatron-core's backward collectives would then allocate on a CUDA device.
    custom_backward((out * dout).sum(), None)
    grads = (x.grad, mlp.linear_fc1.weight.grad.clone(), mlp.linear_fc2.weight.grad.clone())
    mlp.zero_grad(set_to_none=True)
    return out.detach(), *grads


def mlp(rank, world, port, sequence_parallel, work_dir):
    """TP = ``world``: each variant's outputs and gradients, this rank's parts of the reference's, and the
    graph breaks dynamo counted while compiling."""
    from mcore_test_workers import _setup

    _setup()
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F_
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from rlcore_megatron.compiled import (
        _resolve_default_tp_group_quietly,
        _skip_max_connections_warning,
        _sum_input_grads_in_graph,
    )
    from rlcore_megatron.convert import ParamMap, shard
    from rlcore_megatron.mlp import SplitGateUpMLP, use_split_gate_up
    from torch._dynamo.utils import counters

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mpu.initialize_model_parallel(tensor_model_parallel_size=world, create_gloo_process_groups=False)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    tp_rank = mpu.get_tensor_model_parallel_rank()
    config = TransformerConfig(
        num_layers=1,
        hidden_size=H,
        num_attention_heads=2,
        ffn_hidden_size=F,
        gated_linear_unit=True,
        activation_func=F_.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.float64,
        use_cpu_initialization=True,
        perform_initialization=False,
        tensor_model_parallel_size=world,
        sequence_parallel=sequence_parallel,
    )
    gen = torch.Generator().manual_seed(0)
    w_gate, w_up, w_down = (
        torch.randn(*s, generator=gen, dtype=torch.float64) for s in ((F, H), (F, H), (H, F))
    )
    x, dout = (torch.randn(S, B, H, generator=gen, dtype=torch.float64) for _ in range(2))
    fc1 = ParamMap("mlp.linear_fc1.weight", ("gate", "up"), "gate_up", 0, 0)
    fc2 = ParamMap("mlp.linear_fc2.weight", ("down",), "copy", 1, 0)

    def build():
        """megatron-core's MLP as TransformerLayer builds it, this rank's shards of the weights loaded."""
        submodules = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
        module = MLP(config, submodules, ffn_hidden_size=F, tp_group=mpu.get_tensor_model_parallel_group())
        with torch.no_grad():
            module.linear_fc1.weight.copy_(shard(fc1, torch.cat([w_gate, w_up]), tp_rank, world))
            module.linear_fc2.weight.copy_(shard(fc2, w_down, tp_rank, world))
        return module

    theirs, ours, compiled = build(), build(), build()
    assert use_split_gate_up(ours) == use_split_gate_up(compiled) == 1
    assert type(ours) is type(compiled) is SplitGateUpMLP and type(theirs) is MLP
    # What rlcore_megatron.compiled.compile_layers does to each layer before torch.compile.
    _resolve_default_tp_group_quietly()
    _skip_max_connections_warning()
    _sum_input_grads_in_graph(compiled)
    compiled.compile(dynamic=True)

    # Under sequence parallelism each rank holds (and gets the gradient of) its block of the sequence.
    part = slice(tp_rank * S // world, (tp_rank + 1) * S // world) if sequence_parallel else slice(None)
    ref_out, ref_dx, ref_gate, ref_up, ref_down = _reference(x, dout, w_gate, w_up, w_down)
    r = {
        "layout": f"tp{world}" + ("_sp" if sequence_parallel else ""),
        "reference": (
            ref_out[part],
            ref_dx[part],
            shard(fc1, torch.cat([ref_gate, ref_up]), tp_rank, world),
            shard(fc2, ref_down, tp_rank, world),
        ),
        "megatron": _run(theirs, x[part], dout[part]),
        "split": _run(ours, x[part], dout[part]),
    }
    counters.clear()
    r["split_compiled"] = _run(compiled, x[part], dout[part])
    if not sequence_parallel:
        # megatron-core's checkpoint runs its recompute's backward through torch.autograd.backward, which
        # the CPU redirect's torch-function mode sees and is off inside: under sequence parallelism
        # linear_fc2's own gather would then allocate on a CUDA device (a limit of the redirect only).
        r["split_compiled_recompute"] = _run(compiled, x[part], dout[part], recompute=True)
    r["graph_breaks"] = dict(counters["graph_break"])
    r["split_compiled_runs"] = getattr(compiled, "_compiled_call_impl", None) is not None
    torch.save(r, Path(work_dir) / f"mlp_rank{rank}.pt")
    dist.barrier()
    mpu.destroy_model_parallel()
    dist.destroy_process_group()
