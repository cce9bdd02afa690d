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
