"""Worker processes for the Qwen3 / mixture-of-experts tests (``test_architectures.py``).

Each scenario builds real ``MegatronEngine`` instances on gloo (CPU redirect installed, as in
``mcore_test_workers``) and saves what the tests compare with float64 Hugging Face references to
``out_dir/<scenario>_rank<r>.pt``.
"""

from __future__ import annotations

from pathlib import Path

from mcore_test_workers import _engine, _export, _infer, _save, _setup

#: The load-balancing loss coefficient of the ``aux`` scenario: large, so its share of the step shows.
AUX_COEFF = 0.1


def _engine_for(path, rank, world, port, **layout):
    """An engine without the load-balancing loss: HF's forward has none, so the step compares."""
    return _engine(path, rank, world, port, moe_aux_loss_coeff=0.0, **layout)


def _run(engine, batch, r, key, rows=None):
    """``rows[dp_rank]``: the batch rows of each data-parallel rank (default: equal consecutive chunks)."""
    from mcore_testlib import nll_loss

    rank, size = engine.dp_rank_and_size()
    if rows is not None:
        part = batch.index(rows[rank])
    else:
        part = batch.chunk(size)[rank] if size > 1 else batch
    r[f"{key}_holds"] = engine.holds_output()
    r[f"{key}_dp"] = (rank, size)
    r[f"{key}_experts_here"] = sum(
        1 for name, _ in engine.module.named_modules() if name.split(".")[-2:-1] == ["local_experts"]
    )
    r[f"{key}_sequence_parallel"] = engine.tf_config.sequence_parallel
    r[f"{key}_expert_modules"] = sorted(
        {type(m).__name__ for n, m in engine.module.named_modules() if n.endswith("mlp.experts")}
    )
    r[f"{key}_mlp_modules"] = sorted(
        {type(m).__name__ for n, m in engine.module.named_modules() if n.endswith(".mlp")}
    )
    r[f"{key}_export0"] = _export(engine)
    r[f"{key}_infer"] = _infer(engine, part, ("log_probs", "entropy"))
    r[f"{key}_metrics"] = engine.train_step(part, nll_loss)
    r[f"{key}_export1"] = _export(engine)
    r[f"{key}_infer1"] = _infer(engine, part, ("log_probs",))


def arch1(rank, world, port, paths, batch, work_dir):
    """One rank: each architecture at TP=1."""
    _setup()
    r = {}
    for arch, path in paths.items():
        _run(_engine_for(path, rank, world, port), batch, r, arch)
    # megatron-core's own dense MLP (one GEMM into [gate | up]), which megatron.split_gate_up replaces.
    _run(_engine_for(paths["qwen3"], rank, world, port, split_gate_up=False), batch, r, "qwen3_fused")
    # The load-balancing loss, on packed rows (no padding tokens routed) in one micro-batch, so a plain
    # float64 reference can count the same tokens; with megatron-core's per-expert loop, which every
    # other scenario replaces by grouped GEMMs (megatron.moe_grouped_gemm, the default).
    aux = _engine(
        paths["qwen3_moe"],
        rank,
        world,
        port,
        moe_aux_loss_coeff=AUX_COEFF,
        remove_padding=True,
        micro_batch_size=4,
        moe_grouped_gemm=False,
    )
    _run(aux, batch, r, "aux")
    _save(r, Path(work_dir), "arch1", rank)


def arch2(rank, world, port, paths, batch, work_dir):
    """Two ranks: TP=2 (Qwen3, Qwen3-MoE), EP=2 (Qwen3-MoE, Mixtral), PP=2 (Qwen3-MoE)."""
    _setup()
    from megatron.core import parallel_state as mpu

    r = {}
    for key, arch, layout in (
        ("tp2_qwen3", "qwen3", dict(tp=2)),
        ("tp2_qwen3_moe", "qwen3_moe", dict(tp=2)),
        ("pp2_qwen3_moe", "qwen3_moe", dict(pp=2)),
        ("ep2_qwen3_moe", "qwen3_moe", dict(ep=2)),
        ("ep2_mixtral", "mixtral", dict(ep=2)),
    ):
        engine = _engine_for(paths[arch], rank, world, port, **layout)
        _run(engine, batch, r, key)
        del engine
        mpu.destroy_model_parallel()
    # EP=2 with ranks that plan different numbers of micro-batches (MoE layers exchange tokens, so both
    # must run as many): rank 1's one row against rank 0's three, one row a micro-batch (rank 1 runs two
    # ghosts); then packed, 14 tokens a micro-batch, rows of 11 + 6 tokens (two micro-batches) against
    # 9 + 5 (one, cut in two).
    for key, rows, layout in (
        ("ep2_ghosts", [[0, 1, 2], [3]], dict(micro_batch_size=1)),
        ("ep2_cut", [[0, 1], [2, 3]], dict(remove_padding=True, max_tokens_per_micro_batch=14)),
    ):
        engine = _engine_for(paths["qwen3_moe"], rank, world, port, ep=2, **layout)
        _run(engine, batch, r, key, rows)
        del engine
        mpu.destroy_model_parallel()
    _save(r, Path(work_dir), "arch2", rank)
