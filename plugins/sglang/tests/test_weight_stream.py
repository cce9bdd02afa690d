"""The weight stream into SGLang's flattened buckets: names, shapes and ties checked against the served
model (the tiny Qwen2, tied embeddings), and the packed bytes checked against a float64 reference
decoded independently of the packer (``torch.frombuffer`` on the raw bytes)."""

import pytest
import torch
from rlcore.weights import bucketize
from rlcore_sglang.weight_stream import ModelWeights, WeightStreamError, checked_tensors, pack, unpack


@pytest.fixture(scope="module")
def weights(tiny_model_path):
    return ModelWeights.from_pretrained(str(tiny_model_path))


@pytest.fixture(scope="module")
def reference(weights):
    """Random float64 values for every weight of the model, in state-dict order."""
    g = torch.Generator().manual_seed(0)
    tied = weights.canonical
    values = {}
    for name, shape in weights.layout.shapes.items():
        source = tied.get(name, name)
        values[name] = (
            values[source] if source in values else torch.randn(shape, generator=g, dtype=torch.float64)
        )
    return values


def decode(flat: torch.Tensor, start: int, end: int, dtype: torch.dtype, shape) -> torch.Tensor:
    """The tensor stored in ``flat[start:end]``, decoded from a copy of its raw bytes."""
    raw = bytearray(flat[start:end].cpu().numpy().tobytes())
    return torch.frombuffer(raw, dtype=dtype).reshape(shape).clone()


def test_model_weights_of_the_tiny_model(weights):
    assert weights.layout.shapes["model.embed_tokens.weight"] == weights.layout.shapes["lm_head.weight"]
    # Tied: SGLang's Qwen2 holds one tensor, loaded under the embedding's name.
    assert dict(weights.canonical) == {
        "model.embed_tokens.weight": "model.embed_tokens.weight",
        "lm_head.weight": "model.embed_tokens.weight",
    }
    assert "lm_head.weight" not in weights.targets() and "model.norm.weight" in weights.targets()
    assert len(weights.targets()) == len(weights.layout.shapes) - 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_packed_buckets_hold_the_reference_values(weights, reference, dtype):
    """Trainer-style stream (float64, split by a 64 KiB bound) -> checked -> packed in 96 KiB buckets.
    Every weight is in exactly one bucket, stored as ``reference.to(dtype)`` bit for bit, and buckets
    respect their bound unless a single tensor is larger."""
    named = [(n, t) for n, t in reference.items() if n != "lm_head.weight"]  # as named_parameters() sends it
    bound = 96 * 1024
    buckets = list(
        pack(
            checked_tensors(bucketize(named, 64 * 1024), weights, dtype),
            bucket_bytes=bound,
            device=torch.device("cpu"),
        )
    )
    assert len(buckets) > 3
    seen = []
    for bucket in buckets:
        assert bucket.flat.dtype == torch.uint8 and bucket.flat.dim() == 1
        edges = [(s.start, s.end) for s in bucket.slots]
        assert edges[0][0] == 0 and edges[-1][1] == bucket.flat.numel()
        assert all(a[1] == b[0] for a, b in zip(edges, edges[1:], strict=False)), "slots are back to back"
        assert bucket.flat.numel() <= bound or len(bucket.slots) == 1
        for slot in bucket.slots:
            want = reference[slot.name].to(dtype)
            assert slot.dtype == dtype and slot.shape == tuple(want.shape)
            assert torch.equal(decode(bucket.flat, slot.start, slot.end, dtype, slot.shape), want), slot.name
            seen.append(slot.name)
        for name, tensor in unpack(bucket):  # the packer's own inverse agrees
            assert torch.equal(tensor, reference[name].to(dtype))
    assert sorted(seen) == sorted(weights.targets())


def test_a_tied_weight_is_sent_once_under_the_name_sglang_loads(weights, reference):
    head = reference["lm_head.weight"]
    only_head = list(checked_tensors([[("lm_head.weight", head)]], weights, torch.float32))
    assert [n for n, _ in only_head] == ["model.embed_tokens.weight"]
    both = [("model.embed_tokens.weight", head), ("lm_head.weight", head.clone())]
    assert [n for n, _ in checked_tensors([both], weights, torch.float32)] == ["model.embed_tokens.weight"]
    differ = [("model.embed_tokens.weight", head), ("lm_head.weight", head + 1)]
    with pytest.raises(WeightStreamError, match="ties 'model.embed_tokens.weight' and 'lm_head.weight'"):
        list(checked_tensors([differ], weights, torch.float32))


def test_bad_tensors_raise_before_they_are_sent(weights, reference):
    norm = reference["model.norm.weight"]
    with pytest.raises(
        WeightStreamError, match=r"'module.model.norm.weight'.*does not have.*'model.norm.weight'"
    ):
        list(checked_tensors([[("module.model.norm.weight", norm)]], weights, torch.float32))
    with pytest.raises(WeightStreamError, match=r"'model.norm.weight' with shape \(3,\).*has shape"):
        list(checked_tensors([[("model.norm.weight", norm[:3])]], weights, torch.float32))
    with pytest.raises(WeightStreamError, match="sent 'model.norm.weight' twice"):
        list(
            checked_tensors(
                [[("model.norm.weight", norm)], [("model.norm.weight", norm)]], weights, torch.float32
            )
        )


class Stream:
    """A transport's receive side: iterable buckets with a ``close()`` that drains the sender."""

    def __init__(self, buckets):
        self.buckets, self.closed = buckets, False

    def __iter__(self):
        return iter(self.buckets)

    def close(self):
        self.closed = True


def test_a_bad_tensor_mid_stream_packs_what_came_before_then_raises(weights, reference):
    good = [(n, reference[n]) for n in list(weights.targets())[:5]]
    stream = Stream([good, [("model.layers.0.mlp.down_prj.weight", good[0][1])], good[:1]])
    packed = pack(
        checked_tensors(stream, weights, torch.float32), bucket_bytes=1 << 30, device=torch.device("cpu")
    )
    first = next(packed)
    assert first.names == [n for n, _ in good]  # everything valid before the bad name, in one bucket
    with pytest.raises(WeightStreamError, match="down_prj"):
        next(packed)
    assert stream.closed, "the transport is told the stream ended, so its sender is not left blocked"


def test_pack_rejects_a_bad_bound():
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        list(pack([("a", torch.zeros(2))], bucket_bytes=0, device=torch.device("cpu")))


def test_mixture_of_experts_goes_by_the_checkpoints_per_expert_names(tmp_path):
    """SGLang's ``load_weights`` takes a mixture of experts as the checkpoint's per-expert tensors
    (Mixtral's ``block_sparse_moe.experts.{e}.w1``), which the stream is checked against; transformers'
    fused in-memory names are refused, saying what to send."""
    from rlcore.testing.tiny import build_tiny_model
    from rlcore.weights import CheckpointFormat
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(
        tmp_path / "mixtral", architecture="mixtral", hidden_size=32, intermediate_size=16, num_experts=3
    )
    weights = ModelWeights.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    named = list(CheckpointFormat(model).to_checkpoint(model.named_parameters()))
    sent = dict(checked_tensors(bucketize(named, 4096), weights, torch.float32))
    experts = "model.layers.0.block_sparse_moe.experts"
    assert {f"{experts}.{e}.{w}.weight" for e in range(3) for w in ("w1", "w2", "w3")} <= set(sent)
    assert set(sent) == weights.targets()
    fused = [("model.layers.0.mlp.experts.gate_up_proj", torch.zeros(3, 32, 32))]
    with pytest.raises(
        WeightStreamError, match=r"in-memory \(fused\) form.*block_sparse_moe\.experts\.0\.w1"
    ):
        list(checked_tensors([fused], weights, torch.float32))
