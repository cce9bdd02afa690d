"""``megatron.compile``: each decoder layer through ``torch.compile``, traced whole.

A compiled layer is worth most when dynamo traces all of it into one graph: every graph break leaves the
code around it eager and adds a graph boundary. These broke it in a Megatron layer:

* rlcore's packed attention used to be excluded (it is traced now: ``rlcore_megatron.attention``);
* megatron-core's row-parallel linears (the attention's output projection and the MLP's second one) pass
  ``tp_group=None`` to ``get_tensor_model_parallel_group_if_none``, which calls ``warnings.warn`` on rank 0
  at every call (0.16-0.19) before returning the default group. A warning is a graph break to dynamo, and
  inside the layer's activation-offloading context manager it cannot resume there, so rank 0's layers
  ran largely eager. :func:`_resolve_default_tp_group_quietly` resolves the default group before that
  check, so it has nothing to warn about; the group it returns is the one it would have returned;
* with tensor parallelism, megatron-core's column-parallel linears warn once per process (a once-flag on
  ``linear_with_grad_accumulation_and_async_allreduce``) unless ``CUDA_DEVICE_MAX_CONNECTIONS=1``. Once is
  enough: the first compiled call breaks there, and the layer code around it stays eager for good (a TP=2
  step of the 0.5B shape on 2 x H200 hit dynamo's recompile limit in the linears, tracing each one
  alone);
* in training, the same linears all-reduce their input's gradient with ``async_op=True`` (to overlap the
  weight-gradient matmul, the overlap that warning is about), which dynamo cannot trace: every such linear
  was a graph break in the forward (a TP=2 layer ran as ~8 graphs on 2 x H200).
  :func:`_sum_input_grads_in_graph` switches the compiled layers' linears to megatron-core's other path for
  the same sum, ``copy_to_tensor_model_parallel_region`` (a synchronous all-reduce in the backward, traced),
  where the warning's advice does not apply, so :func:`_skip_max_connections_warning` sets its flag.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state


def compile_layers(module: torch.nn.Module) -> None:
    """``torch.compile`` (dynamic shapes) every decoder layer of megatron-core's ``module``, in place."""
    _resolve_default_tp_group_quietly()
    _skip_max_connections_warning()
    for layer in module.decoder.layers:
        _sum_input_grads_in_graph(layer)
        layer.compile(dynamic=True)


def _sum_input_grads_in_graph(layer: torch.nn.Module) -> None:
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    for linear in layer.modules():
        if isinstance(linear, ColumnParallelLinear) and linear.allreduce_dgrad:
            # ColumnParallelLinear.forward reads this at each call: False (with neither sequence
            # parallelism nor expert communication) sends the input through copy_to_tensor_model_parallel_region.
            linear.allreduce_dgrad = False


def _skip_max_connections_warning() -> None:
    from megatron.core.tensor_parallel import layers

    # Only this once-flag guards the warning; the layers no longer take the async path it is about.
    layers.linear_with_grad_accumulation_and_async_allreduce.warned = True


def _resolve_default_tp_group_quietly() -> None:
    from megatron.core.tensor_parallel import layers

    warning = layers.get_tensor_model_parallel_group_if_none
    if getattr(warning, "rlcore_quiet", False):
        return

    def quiet(tp_group=None, is_expert=False, check_initialized=True):
        if tp_group is None and torch.distributed.is_initialized() and parallel_state.is_initialized():
            default = (
                parallel_state.get_expert_tensor_parallel_group
                if is_expert
                else parallel_state.get_tensor_model_parallel_group
            )
            tp_group = default(check_initialized=check_initialized)
        return warning(tp_group, is_expert=is_expert, check_initialized=check_initialized)

    quiet.rlcore_quiet = True
    layers.get_tensor_model_parallel_group_if_none = quiet
