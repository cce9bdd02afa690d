"""Request ids and aborts of the SGLang rollout, against a stand-in for ``sglang.Engine`` on the plugin's
real engine loop (no sglang here): a batch from ``generate`` carries no ids (SGLang names them; explicit ids
slowed its large batches), ``agenerate`` gives its requests fixed-width ids and a cancellation aborts
exactly those; SGLang's scheduler aborts by id prefix, so no id may be a prefix of another."""

import asyncio
import itertools
import time

import pytest
from rlcore.api import SamplingParams
from rlcore_sglang.config import SGLangConfig
from rlcore_sglang.engine import SGLangRollout
from rlcore_sglang.engine_loop import EngineLoop
from rlcore_sglang.memory import MemoryTags


class TokenizerManager:
    def __init__(self):
        self.aborted: list[dict] = []

    def abort_request(self, rid: str = "", abort_all: bool = False):
        self.aborted.append({"rid": rid, "abort_all": abort_all})


class FakeSGLang:
    """Answers ``async_generate`` as SGLang does (one result dict per request); ``stall`` keeps a call
    waiting until it is cancelled."""

    def __init__(self):
        self.tokenizer_manager = TokenizerManager()
        self.calls: list[dict] = []
        self.stall = False

    async def async_generate(self, input_ids, sampling_params, return_logprob, **kwargs):
        self.calls.append({"n": len(input_ids), **kwargs})
        if self.stall:
            await asyncio.sleep(3600)
        rids = kwargs.get("rid") or [f"sglang-{i}" for i in range(len(input_ids))]
        return [
            {
                "text": "",
                "output_ids": [7, 8],
                "meta_info": {
                    "id": rid,
                    "finish_reason": {"type": "length"},
                    "output_token_logprobs": [(-0.5, 7, None), (-0.25, 8, None)],
                },
            }
            for rid in rids
        ]


@pytest.fixture
def rollout():
    engine = SGLangRollout.__new__(SGLangRollout)  # no sglang: the parts under test only
    engine.config = SGLangConfig()
    engine.memory = MemoryTags(memory_saver=False, weights_backup=False, cuda_graph=False)
    engine.vocab_size, engine.max_model_len = 100, 64
    engine._warned_seed = True
    engine.vision = None  # a text model
    engine._ids, engine._run_id = itertools.count(), "run1"
    engine._loop = EngineLoop(FakeSGLang)
    engine.adapter = None
    yield engine
    engine._loop.close()


PARAMS = SamplingParams(n=2, max_tokens=2, temperature=1.0)


def test_a_generate_batch_carries_no_request_ids(rollout):
    out = rollout.generate([[1, 2], [3, 4, 5]], PARAMS)
    assert [len(group) for group in out] == [2, 2] and out[1][0].token_ids == [7, 8]
    assert rollout._loop.engine.calls == [{"n": 4}]  # no rid: SGLang names them


def test_agenerate_ids_are_distinct_and_none_is_a_prefix_of_another(rollout):
    async def many():
        return await asyncio.gather(*(rollout.agenerate([1, 2, 3], PARAMS) for _ in range(6)))

    assert len(asyncio.run(many())) == 6
    for _ in range(8):  # ids past 9 and 99 must not extend earlier ones
        asyncio.run(rollout.agenerate([1], PARAMS))
    rids = [rid for call in rollout._loop.engine.calls for rid in call["rid"]]
    assert len(rids) == len(set(rids)) == 28
    assert not [(a, b) for a in rids for b in rids if a != b and b.startswith(a)]


def test_cancelling_aborts_exactly_the_cancelled_requests(rollout):
    sglang = rollout._loop.engine
    sglang.stall = True

    async def cancel_one():
        task = asyncio.ensure_future(rollout.agenerate([1, 2], PARAMS))
        while not sglang.calls:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_one())
    deadline = time.time() + 5
    while len(sglang.tokenizer_manager.aborted) < 2 and time.time() < deadline:
        time.sleep(0.01)
    assert sglang.tokenizer_manager.aborted == [
        {"rid": rid, "abort_all": False} for rid in sglang.calls[0]["rid"]
    ]

    # A whole batch has no ids of its own: cancelling it aborts what the engine runs.
    sglang.tokenizer_manager.aborted.clear()
    future = rollout._loop.submit(lambda: rollout._generate([([1], None, [])], PARAMS, own_ids=False))
    deadline = time.time() + 5
    while len(sglang.calls) < 2 and time.time() < deadline:
        time.sleep(0.01)
    assert len(sglang.calls) == 2, (
        future.exception(timeout=1) if future.done() else "the batch never reached SGLang"
    )
    future.cancel()
    while not sglang.tokenizer_manager.aborted and time.time() < deadline:
        time.sleep(0.01)
    assert sglang.tokenizer_manager.aborted == [{"rid": "", "abort_all": True}]
