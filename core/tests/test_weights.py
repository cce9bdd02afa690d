import pytest
import torch
from rlcore.weights import assemble, bucketize, tensor_bytes


def _tensors():
    g = torch.Generator().manual_seed(0)
    return [
        ("a.weight", torch.randn(4, 4, generator=g)),  # 64 B
        ("b.weight", torch.randn(100, generator=g)),  # 400 B: larger than a bucket, gets split
        ("c.bias", torch.randn(3, generator=g)),
        ("d.weight", torch.randn(2, 3, 5, generator=g)),
    ]


@pytest.mark.parametrize("bucket_bytes", [1, 7, 64, 128, 10_000])
def test_round_trip_and_bucket_bound(bucket_bytes):
    original = _tensors()
    buckets = list(bucketize(original, bucket_bytes))
    for bucket in buckets:
        elem = bucket[0][1].element_size()
        # A bucket exceeds the bound only when a single element is larger than the bound.
        assert sum(tensor_bytes(t) for _, t in bucket) <= max(bucket_bytes, elem)
    out = list(assemble(buckets))
    assert [n for n, _ in out] == [n for n, _ in original]
    for (_, got), (_, want) in zip(out, original, strict=True):
        assert got.shape == want.shape
        assert torch.equal(got, want)


def test_dtype_cast():
    out = list(assemble(bucketize(_tensors(), 128, dtype=torch.bfloat16)))
    assert all(t.dtype == torch.bfloat16 for _, t in out)
    assert torch.equal(out[1][1], _tensors()[1][1].to(torch.bfloat16))


def test_incomplete_stream_is_an_error():
    buckets = list(bucketize(_tensors(), 64))
    pieces_of_b = [b for b in buckets if b[0][0].startswith("b.weight@")]
    assert len(pieces_of_b) == 7  # 400 B in 64 B pieces
    with pytest.raises(ValueError, match="incomplete tensors: \\['b.weight'\\]"):
        list(assemble(pieces_of_b[:-1]))


# -- checkpoint names and layouts ------------------------------------------------------------------
@pytest.fixture(scope="module")
def moe_folders(tmp_path_factory):
    from rlcore.testing.tiny import build_tiny_model

    return {
        arch: build_tiny_model(
            tmp_path_factory.mktemp(arch),
            architecture=arch,
            hidden_size=32,
            intermediate_size=16,
            num_experts=3,
        )
        for arch in ("qwen3_moe", "mixtral")
    }


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_checkpoint_format_streams_what_save_pretrained_writes(moe_folders, arch):
    from rlcore.weights import CheckpointFormat
    from safetensors.torch import load_file

    model = _load(moe_folders[arch])
    form = CheckpointFormat(model)
    saved = load_file(str(moe_folders[arch] / "model.safetensors"))
    converted = list(form.to_checkpoint(model.state_dict().items()))
    assert {n for n, _ in converted} == set(saved) | {"lm_head.weight"}
    for name, tensor in converted:
        assert tensor.is_contiguous()
        if name in saved:
            assert torch.equal(tensor, saved[name]), name
    assert form.shapes == {name: tuple(t.shape) for name, t in converted}


def test_checkpoint_format_of_qwen3_moe_by_hand(moe_folders):
    """The layout worked out independently: ``gate_up_proj[e]`` is expert e's gate rows then its up rows,
    ``down_proj[e]`` its down projection; copies of only some experts change only their slices."""
    from rlcore.weights import CheckpointFormat, WeightLayout

    model = _load(moe_folders["qwen3_moe"])
    form = CheckpointFormat(model)
    experts = "model.layers.1.mlp.experts"
    assert form.converted[f"{experts}.gate_up_proj"] == tuple(
        f"{experts}.{e}.{p}.weight" for p in ("gate_proj", "up_proj") for e in range(3)
    )
    state = model.state_dict()
    fused, down = state[f"{experts}.gate_up_proj"].clone(), state[f"{experts}.down_proj"].clone()
    out = dict(form.to_checkpoint([(f"{experts}.gate_up_proj", fused), (f"{experts}.down_proj", down)]))
    assert torch.equal(out[f"{experts}.2.gate_proj.weight"], fused[2, :16])
    assert torch.equal(out[f"{experts}.2.up_proj.weight"], fused[2, 16:])
    assert torch.equal(out[f"{experts}.0.down_proj.weight"], down[0])

    up, norm = torch.randn(16, 32), torch.randn(32)
    form.copy_into(state, {f"{experts}.1.up_proj.weight": up, "model.norm.weight": norm})
    want = fused.clone()
    want[1, 16:] = up
    assert torch.equal(state[f"{experts}.gate_up_proj"], want)
    assert torch.equal(state[f"{experts}.down_proj"], down)
    assert torch.equal(state["model.norm.weight"], norm)

    layout = WeightLayout.from_pretrained(str(moe_folders["qwen3_moe"]))
    assert layout.shapes == form.shapes
    assert "fused" in layout.mismatch(f"{experts}.gate_up_proj", fused)


def test_checkpoint_format_of_a_dense_model_changes_nothing(tiny_model_path):
    from rlcore.weights import CheckpointFormat

    model = _load(tiny_model_path)
    form = CheckpointFormat(model)
    assert form.converted == {}
    named = list(model.state_dict().items())
    assert list(form.to_checkpoint(named)) == named
