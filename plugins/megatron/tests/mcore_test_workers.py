"""Worker processes for the megatron engine tests (spawned by ``mcore_testlib.spawn``).

Each worker installs the test-only CPU redirection, runs real ``MegatronEngine`` instances on gloo and
saves what the tests check to ``out_dir/<scenario>_rank<r>.pt``. The tests compare against Hugging Face
references computed in the pytest process.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

ADAM_EPS = 1e-3


def _setup():
    import warnings

    import mcore_cpu_redirect
    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    mcore_cpu_redirect.install()


def _engine(
    path,
    rank,
    world,
    port,
    *,
    tp=1,
    pp=1,
    dp_opt=True,
    remove_padding=False,
    logits_chunk_size=None,
    compile=False,
    recompute_logits=True,
    ep=1,
    moe_aux_loss_coeff=None,
    moe_grouped_gemm=True,
    split_gate_up=True,
    **spec,
):
    from rlcore.api import DistInfo, EngineSpec
    from rlcore.devices import get_platform
    from rlcore_megatron.config import MegatronConfig
    from rlcore_megatron.engine import MegatronEngine

    defaults = dict(lr=1e-3, weight_decay=0.01, grad_clip=1.0, micro_batch_size=2)
    # A large Adam epsilon keeps the first step's update a smooth function of the gradient, so the
    # comparison with HF's AdamW is not dominated by elements whose gradient is ~0.
    cfg = MegatronConfig(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        use_distributed_optimizer=dp_opt,
        adam_eps=ADAM_EPS,
        use_remove_padding=remove_padding,
        logits_chunk_size=logits_chunk_size,
        compile=compile,
        recompute_logits=recompute_logits,
        expert_model_parallel_size=ep,
        moe_aux_loss_coeff=moe_aux_loss_coeff,
        moe_grouped_gemm=moe_grouped_gemm,
        split_gate_up=split_gate_up,
    )
    return MegatronEngine(
        EngineSpec(model_path=str(path), **{**defaults, **spec}),
        cfg,
        get_platform("cpu"),
        DistInfo(rank=rank, world_size=world, master_port=port),
    )


def hf_step(model, batch):
    """One HF AdamW step of ``nll_loss`` with the optimiser settings :func:`_engine` gives the engines
    (``mcore_testlib.hf_train_step``): ``(loss, grad_norm, weights after)``."""
    from mcore_testlib import hf_train_step

    return hf_train_step(
        model, batch, lr=1e-3, betas=(0.9, 0.999), eps=ADAM_EPS, weight_decay=0.01, grad_clip=1.0
    )


def _export(engine):
    """The weight stream in fp32, reassembled (small buckets: big tensors arrive split)."""
    import torch
    from rlcore.weights import assemble

    return {name: t.clone() for name, t in assemble(engine.export_weights(torch.float32, 64 * 1024))}


def _infer(engine, batch, outputs):
    result = engine.infer(batch, outputs)
    return None if result is None else dict(result.tensors)


def world1(rank, world, port, qwen, llama, batches, work_dir):
    """TP=1 in one process: numerics, a training step, checkpoints, offload, value head, Llama."""
    _setup()
    from mcore_testlib import nll_loss, value_loss

    b1, b2, lb = batches
    work = Path(work_dir)
    r = {}
    eng = _engine(qwen, rank, world, port, lr_schedule="cosine", total_steps=4)
    r["export0"] = _export(eng)
    r["infer0"] = _infer(eng, b1, ("log_probs", "entropy"))
    r["metrics1"] = eng.train_step(b1, nll_loss)
    r["export1"] = _export(eng)
    eng.save_checkpoint(str(work / "ckpt"))

    r["infer1"] = _infer(eng, b2, ("log_probs",))
    eng.release(["weights", "grads", "optimizer"])
    r["released_bytes"] = sum(p.untyped_storage().nbytes() for p in eng.module.parameters())
    try:
        eng.infer(b2, ("log_probs",))
    except RuntimeError as exc:
        r["released_error"] = str(exc)
    eng.resume(["weights", "grads", "optimizer"])
    r["infer1_resumed"] = _infer(eng, b2, ("log_probs",))
    r["metrics2"] = eng.train_step(b2, nll_loss)
    r["export2"] = _export(eng)

    fresh = _engine(qwen, rank, world, port, lr_schedule="cosine", total_steps=4)
    fresh.load_checkpoint(str(work / "ckpt"))
    r["steps_reloaded"] = fresh.steps
    r["metrics2_reloaded"] = fresh.train_step(b2, nll_loss)
    r["export2_reloaded"] = _export(fresh)
    fresh.export_hf(str(work / "hf_export"))
    r["planted"] = _load_planted_checkpoints(fresh, work / "ckpt")
    del eng, fresh

    recompute = _engine(
        qwen, rank, world, port, lr_schedule="cosine", total_steps=4, gradient_checkpointing=True
    )
    r["metrics1_recompute"] = recompute.train_step(b1, nll_loss)
    r["export1_recompute"] = _export(recompute)
    del recompute

    critic = _engine(qwen, rank, world, port, head="value", seed=3)
    r["values"] = _infer(critic, b1, ("values",))
    r["critic_export0"] = _export(critic)
    r["critic_metrics"] = critic.train_step(b1, value_loss)
    r["critic_export1"] = _export(critic)
    del critic

    # bf16 parameters with fp32 master weights in Megatron's non-distributed optimizer, and its
    # checkpoint round trip; then a reward-model (score) head.
    plain = _engine(qwen, rank, world, port, dp_opt=False, dtype="bfloat16")
    r["bf16_metrics1"] = plain.train_step(b1, nll_loss)
    plain.save_checkpoint(str(work / "ckpt_bf16"))
    r["bf16_metrics2"] = plain.train_step(b2, nll_loss)
    r["bf16_export2"] = _export(plain)
    plain = _engine(qwen, rank, world, port, dp_opt=False, dtype="bfloat16")
    plain.load_checkpoint(str(work / "ckpt_bf16"))
    r["bf16_metrics2_reloaded"] = plain.train_step(b2, nll_loss)
    r["bf16_export2_reloaded"] = _export(plain)
    del plain

    reward = _engine(qwen, rank, world, port, head="score", trainable=False)
    r["scores"] = _infer(reward, b1, ("scores",))
    r["reward_export"] = _export(reward)
    del reward

    ref = _engine(llama, rank, world, port, trainable=False)
    r["llama_export"] = _export(ref)
    r["llama_infer"] = _infer(ref, lb, ("log_probs", "entropy"))
    _save(r, work, "world1", rank)


def _grads(engine):
    """The gradients the last ``train_step`` left in Megatron's buffers, by local parameter name."""
    return {n: p.main_grad.detach().clone() for n, p in engine.module.named_parameters()}


def _leaky_attention():
    """Make the packed attention attend across the whole pack (one sequence), rotary positions left
    per sequence: what a wrong mask would compute. Returns the undo."""
    import torch
    from rlcore_megatron import attention

    right = attention.varlen_attention

    def leaky(q, k, v, cu, max_len, scale, host_bounds=None):
        whole = torch.tensor([0, q.shape[0]], dtype=cu.dtype, device=cu.device)
        return right(q, k, v, whole, q.shape[0], scale, host_bounds=whole.cpu())

    attention.varlen_attention = leaky
    return lambda: setattr(attention, "varlen_attention", right)


def packed1(rank, world, port, qwen, batch, work_dir):
    """``megatron.use_remove_padding`` in one process, against the padded path on the same batch."""
    _setup()
    from mcore_testlib import nll_loss, value_loss

    r = {}
    for name, packed in (("padded", False), ("packed", True)):
        # micro_batch_size 3 over 4 rows: micro-batches of 3 and 1 sequences.
        eng = _engine(qwen, rank, world, port, remove_padding=packed, micro_batch_size=3)
        r[f"{name}_infer"] = _infer(eng, batch, ("log_probs", "entropy"))
        if packed:
            r["host_reads"] = _host_reads_of_boundaries(lambda e=eng: _infer(e, batch, ("log_probs",)))
            undo = _leaky_attention()
            r["leaky_infer"] = _infer(eng, batch, ("log_probs",))
            # With an attention whose work does not depend on the number of sequences (the leaky one),
            # what else does a forward do per sequence? Packs of 2 and of 3 rows (one micro-batch each).
            r["forward_ops"] = {n: _ops_per_forward(eng, batch.index(slice(0, n))) for n in (2, 3)}
            undo()
        r[f"{name}_metrics"] = eng.train_step(batch, nll_loss)
        r[f"{name}_grads"] = _grads(eng)
        r[f"{name}_export1"] = _export(eng)
        del eng
        critic = _engine(qwen, rank, world, port, head="value", seed=3, remove_padding=packed)
        r[f"{name}_values"] = _infer(critic, batch, ("values",))
        r[f"{name}_critic_metrics"] = critic.train_step(batch, value_loss)
        del critic
        reward = _engine(qwen, rank, world, port, head="score", trainable=False, remove_padding=packed)
        r[f"{name}_scores"] = _infer(reward, batch, ("scores",))
        del reward
    # Micro-batches cut by real tokens (7 + 6 + ...: the rows' lengths are 11, 6, 9, 5).
    eng = _engine(qwen, rank, world, port, remove_padding=True, max_tokens_per_micro_batch=16)
    r["packed_tokens_infer"] = _infer(eng, batch, ("log_probs", "entropy"))
    _save(r, Path(work_dir), "packed1", rank)


def _ops_per_forward(engine, batch) -> int:
    """Operators dispatched inside the model's forward while ``engine`` infers ``batch``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    mode = Count()

    def enter(*_):  # hooks return None: a value would replace the forward's inputs or outputs
        mode.__enter__()

    def leave(*_):
        mode.__exit__(None, None, None)

    hooks = [engine.module.register_forward_pre_hook(enter), engine.module.register_forward_hook(leave)]
    try:
        _infer(engine, batch, ("log_probs",))
    finally:
        for hook in hooks:
            hook.remove()
    return Count.ops


def _host_reads_of_boundaries(run) -> dict[str, int]:
    """``run()`` counting ``tolist``/``item`` calls on each micro-batch's sequence boundaries: on the
    device copy (each a sync on a GPU) and on the host copy the engine passes beside it."""
    import torch
    from rlcore_megatron import engine as engine_module

    device_ids, host_ids, counts = set(), set(), {"device": 0, "host": 0}
    # The boundaries stay referenced until the run ends: a freed tensor's id can be reused by any later
    # tensor (a metric's ``item()``), which would then count as a read of the boundaries.
    alive = []
    model_inputs = engine_module._Micro.model_inputs

    def spied_inputs(self):
        tokens, positions, params = model_inputs(self)
        alive.extend((params.cu_seqlens_q, params.cu_seqlens_host))
        device_ids.add(id(params.cu_seqlens_q))
        host_ids.add(id(params.cu_seqlens_host))
        return tokens, positions, params

    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "item")}

    def spy(name):
        def read(self, *args, **kwargs):
            if id(self) in device_ids:
                counts["device"] += 1
            elif id(self) in host_ids:
                counts["host"] += 1
            return originals[name](self, *args, **kwargs)

        return read

    engine_module._Micro.model_inputs = spied_inputs
    for name in originals:
        setattr(torch.Tensor, name, spy(name))
    try:
        run()
    finally:
        engine_module._Micro.model_inputs = model_inputs
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
    return counts


def chunked(rank, world, port, qwen, batch, work_dir):
    """``megatron.logits_chunk_size`` (5 tokens: several chunks per micro-batch) against the whole
    micro-batch's head at TP=``world``: padded, then packed."""
    _setup()
    from mcore_testlib import nll_loss
    from megatron.core import parallel_state as mpu

    r = {}
    variants = (("whole", {}), ("chunked", {"logits_chunk_size": 5}))
    variants += (("chunked_packed", {"logits_chunk_size": 5, "remove_padding": True}),)
    # logits kept from the forward: the fused head at TP=1, each rank's vocabulary slice at TP=2
    variants += (
        ("chunked_kept", {"logits_chunk_size": 5, "remove_padding": True, "recompute_logits": False}),
    )
    for name, kwargs in variants:
        eng = _engine(qwen, rank, world, port, tp=world, **kwargs)
        r[f"{name}_infer"] = _infer(eng, batch, ("log_probs", "entropy"))
        r[f"{name}_metrics"] = eng.train_step(batch, nll_loss)
        r[f"{name}_grads"] = _grads(eng)
        r[f"{name}_export1"] = _export(eng)
        del eng
        mpu.destroy_model_parallel()
    _save(r, Path(work_dir), "chunked", rank)


def packed2(rank, world, port, qwen, batch, work_dir):
    """``megatron.use_remove_padding`` on two ranks: TP=2, then PP=2."""
    _setup()
    from mcore_testlib import nll_loss
    from megatron.core import parallel_state as mpu

    r = {}
    for layout, kwargs in (("tp2", {"tp": 2}), ("pp2", {"pp": 2})):
        eng = _engine(qwen, rank, world, port, remove_padding=True, **kwargs)
        r[f"{layout}_infer"] = _infer(eng, batch, ("log_probs", "entropy"))
        r[f"{layout}_metrics"] = eng.train_step(batch, nll_loss)
        r[f"{layout}_export1"] = _export(eng)
        del eng
        mpu.destroy_model_parallel()
    _save(r, Path(work_dir), "packed2", rank)


def compiled(rank, world, port, qwen, batch, work_dir):
    """``megatron.compile`` (each decoder layer through ``torch.compile``, and at TP=1 the fused head's
    elementwise work) on the packed path with a chunked head, at TP=``world``: inference, a training
    step, the updated weights."""
    _setup()
    from mcore_testlib import nll_loss

    eng = _engine(qwen, rank, world, port, tp=world, remove_padding=True, compile=True, logits_chunk_size=16)
    layers = eng.module.decoder.layers
    r = {"compiled_layers": sum(getattr(layer, "_compiled_call_impl", None) is not None for layer in layers)}
    r["layers"] = len(layers)
    # First: a break that megatron-core makes only once per process (a warning behind a once-flag)
    # still leaves the layers eager for good, so the count must see the very first compiled call.
    r["graph_breaks"], r["traced_infer"] = _graph_breaks_with_a_traceable_kernel(
        lambda: _infer(eng, batch, ("log_probs", "entropy"))
    )
    r["infer"] = _infer(eng, batch, ("log_probs", "entropy"))  # the CPU's per-sequence kernel, compiled
    # The one training step, traced with the stand-in kernel (exact causal attention: the numbers are the
    # real kernel's up to rounding), so its graphs compile once: training traces each autograd function's
    # backward too (megatron-core's linears' gradient all-reduce).
    r["train_graph_breaks"], r["metrics"] = _graph_breaks_with_a_traceable_kernel(
        lambda: eng.train_step(batch, nll_loss)
    )
    r["export1"] = _export(eng)
    _save(r, Path(work_dir), "compiled", rank)


def _graph_breaks_with_a_traceable_kernel(run):
    """Where dynamo breaks the compiled layers' graphs when the var-len kernel is traceable, as PyTorch's
    flash kernel is on a GPU (the CPU has none: there the per-sequence fallback is a deliberate break).
    The kernel is stood in for by exact causal attention under a block-diagonal mask. Returns the graph
    break reasons counted over ``run()`` from a fresh dynamo cache (first: the engine's first call), and
    what it returned."""
    import torch
    import torch.nn.functional as F
    from rlcore.kernels import varlen_attention as va
    from torch._dynamo.utils import counters

    def dense(q, k, v, cu, max_len, scale):
        pos = torch.arange(q.shape[0], device=q.device, dtype=cu.dtype)
        seq = torch.searchsorted(cu, pos, right=True)
        mask = (seq[:, None] == seq[None, :]) & (pos[None, :] <= pos[:, None])
        groups = q.shape[1] // k.shape[1]
        k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(
            *(t.transpose(0, 1) for t in (q, k, v)), attn_mask=mask, scale=scale
        )
        return out.transpose(0, 1)

    saved = va._kernel_runs, va._kernel_call
    va._kernel_runs, va._kernel_call = (lambda device_type, dtype: True), dense
    try:
        torch._dynamo.reset()
        counters.clear()
        out = run()
        return dict(counters["graph_break"]), out
    finally:
        va._kernel_runs, va._kernel_call = saved
        torch._dynamo.reset()


class _Planted:
    """Unpickling this creates ``marker``: a stand-in for a payload that runs arbitrary code."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _load_planted_checkpoints(engine, checkpoint: Path) -> dict:
    """Load copies of ``checkpoint`` with a pickle planted in the DCP index and in the common part:
    per file, the error the load raised (None if it loaded) and whether the payload ran."""
    import pickle
    import shutil

    import torch

    out = {}
    for name in (".metadata", "common.pt"):
        copy = checkpoint.with_name(f"planted{name.replace('.', '_')}")
        shutil.copytree(checkpoint, copy)
        marker = copy / "payload_ran"
        if name == "common.pt":
            torch.save({"common": _Planted(marker)}, copy / "dist" / name)
        else:
            (copy / "dist" / name).write_bytes(pickle.dumps(_Planted(marker)))
        try:
            engine.load_checkpoint(str(copy))
            error = None
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        out[name] = {"error": error, "ran": marker.exists(), "file": str(copy / "dist" / name)}
    return out


def world2(rank, world, port, qwen, llama, batches, work_dir):
    """Two ranks, three layouts in turn: TP=2, PP=2, DP=2."""
    _setup()
    from mcore_testlib import nll_loss
    from megatron.core import parallel_state as mpu

    b1, _, lb = batches
    work = Path(work_dir)
    r = {}

    eng = _engine(qwen, rank, world, port, tp=2)
    r["tp2_holds"] = eng.holds_output()
    r["tp2_dp"] = eng.dp_rank_and_size()
    r["tp2_export0"] = _export(eng)
    r["tp2_infer"] = _infer(eng, b1, ("log_probs", "entropy"))
    r["tp2_metrics"] = eng.train_step(b1, nll_loss)
    r["tp2_export1"] = _export(eng)
    ref = _engine(llama, rank, world, port, tp=2, trainable=False)
    r["tp2_llama_export"] = _export(ref)
    r["tp2_llama_infer"] = _infer(ref, lb, ("log_probs", "entropy"))
    del eng, ref
    mpu.destroy_model_parallel()

    eng = _engine(qwen, rank, world, port, pp=2)
    r["pp2_holds"] = eng.holds_output()
    r["pp2_export0"] = _export(eng)
    with _device_syncs() as syncs:
        r["pp2_infer"] = _infer(eng, b1, ("log_probs", "entropy"))
        r["pp2_metrics"] = eng.train_step(b1, nll_loss)
    r["pp2_device_syncs"] = syncs
    r["pp2_export1"] = _export(eng)
    del eng
    # One row per micro-batch: four hand-offs each way, of 11, 6, 9 and 5 tokens, in 1F1B's order.
    eng = _engine(qwen, rank, world, port, pp=2, micro_batch_size=1)
    with _device_syncs() as syncs, _build_and_run_order(eng) as order:
        r["pp2_mb1_infer"] = _infer(eng, b1, ("log_probs", "entropy"))
        r["pp2_mb1_metrics"] = eng.train_step(b1, nll_loss)
    r["pp2_mb1_device_syncs"] = syncs
    r["pp2_mb1_order"] = order
    del eng
    mpu.destroy_model_parallel()

    eng = _engine(qwen, rank, world, port)
    dp_rank, dp_size = eng.dp_rank_and_size()
    r["dp2_dp"] = (dp_rank, dp_size)
    r["dp2_metrics"] = eng.train_step(b1.chunk(dp_size)[dp_rank], nll_loss)
    r["dp2_export1"] = _export(eng)
    _save(r, work, "world2", rank)


@contextlib.contextmanager
def _build_and_run_order(engine):
    """Records, in order, each micro-batch input build (``"build"``) and each forward of this stage's
    model (``"run"``)."""
    import rlcore_megatron.engine as engine_module

    order: list[str] = []
    built = engine_module.to_device

    def to_device(*args, **kwargs):
        order.append("build")
        return built(*args, **kwargs)

    def ran(*_):  # returns None: a value would replace the forward's inputs
        order.append("run")

    engine_module.to_device = to_device
    hook = engine.module.register_forward_pre_hook(ran)
    try:
        yield order
    finally:
        engine_module.to_device = built
        hook.remove()


@contextlib.contextmanager
def _device_syncs():
    """Counts ``torch.cuda.synchronize()`` calls inside (a no-op under the CPU redirect) by caller."""
    import torch

    calls: dict[str, int] = {}
    redirected = torch.cuda.synchronize

    def counted(*args, **kwargs):
        caller = sys._getframe(1)
        where = f"{caller.f_code.co_filename.rsplit('/', 1)[-1]}:{caller.f_code.co_name}"
        calls[where] = calls.get(where, 0) + 1
        return redirected(*args, **kwargs)

    torch.cuda.synchronize = counted
    try:
        yield calls
    finally:
        torch.cuda.synchronize = redirected


def _save(results, work: Path, scenario: str, rank: int) -> None:
    import torch

    torch.save(results, work / f"{scenario}_rank{rank}.pt")
