"""The in-process transport: the same tensors, by reference, in order."""

import importlib.util
import pickle
from pathlib import Path

import pytest
from rlcore.plugins import registry
from rlcore.transports import TransportConfig, build_transport
from rlcore.transports.inprocess import InProcessTransport
from rlcore.weights import assemble

_spec = importlib.util.spec_from_file_location("transport_streams", Path(__file__).parent / "streams.py")
streams = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(streams)


def test_registered_transports():
    names = registry("weight_transports").names()
    assert {"broadcast", "inprocess", "ray"} <= set(names)  # core's own; plugins may add (hccl)
    for name in ("broadcast", "inprocess", "ray"):
        entry = registry("weight_transports").entry(name)
        assert entry.options["config"] is TransportConfig
        assert entry.plugin == "rlcore.builtin.transports"
    assert isinstance(build_transport(TransportConfig(name="inprocess")), InProcessTransport)


def test_moves_the_stream_by_reference():
    sent = streams.buckets(0)
    transport = InProcessTransport()
    handle = transport.send(iter(sent))  # a lazy iterator, as export_weights yields
    received = list(transport.receive(handle))
    assert streams.fingerprint(received) == streams.fingerprint(sent)
    assert all(
        got.data_ptr() == want.data_ptr()
        for got_bucket, want_bucket in zip(received, sent, strict=True)
        for (_, got), (_, want) in zip(got_bucket, want_bucket, strict=True)
    )
    assert [n for n, _ in assemble(received)] == [n for n, _ in streams.named_tensors(0)]
    payload = sum(t.numel() * t.element_size() for b in sent for _, t in b)
    assert transport.last_stats["sync/bytes"] == payload
    assert transport.last_stats["sync/buckets"] == len(sent)
    assert transport.last_receive_stats["sync/receive_bytes"] == payload


def test_handle_cannot_leave_the_process():
    handle = InProcessTransport().send(streams.buckets(0))
    with pytest.raises(TypeError, match="set transport.name to 'ray' or 'broadcast'"):
        pickle.dumps(handle)
    with pytest.raises(TypeError, match="pass what its send"):
        next(InProcessTransport().receive(["not a handle"]))


def test_config_validation():
    with pytest.raises(ValueError, match="transport.bucket_bytes must be positive"):
        TransportConfig(bucket_bytes=0)
