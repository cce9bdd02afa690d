"""The SGLang rollout's adapter sync against a stand-in for SGLang's tokenizer manager (no sglang here; the
GPU test ``test_lora_gpu.py`` checks the log-probs): each adapter stream becomes a PEFT folder that
transformers' PEFT reads back as the same tensors, the previous adapter is unloaded before the new one is
loaded (SGLang keeps one), and later requests name the new adapter."""

import json
import sys
import types
from dataclasses import dataclass

import pytest
import torch
from rlcore.api import LoraSpec, RolloutSpec, SamplingParams
from rlcore_sglang import adapters
from rlcore_sglang.config import SGLangConfig
from rlcore_sglang.engine import SGLangRollout
from rlcore_sglang.engine_loop import EngineLoop
from rlcore_sglang.memory import MemoryTags
from safetensors.torch import load_file


@dataclass
class LoadLoRAAdapterReqInput:
    lora_name: str
    lora_path: str


@dataclass
class UnloadLoRAAdapterReqInput:
    lora_name: str


@dataclass
class Result:
    success: bool
    error_message: str | None = None


class Manager:
    def __init__(self):
        self.log: list[tuple[str, str]] = []
        self.refuse = False

    async def load_lora_adapter(self, obj, request):
        self.log.append(("load", obj.lora_name))
        return Result(not self.refuse, "no room" if self.refuse else None)

    async def unload_lora_adapter(self, obj, request):
        self.log.append(("unload", obj.lora_name))
        return Result(True)

    async def flush_cache(self):
        self.log.append(("flush", ""))
        return Result(True)

    def abort_request(self, rid="", abort_all=False):
        pass


class FakeSGLang:
    def __init__(self):
        self.tokenizer_manager = Manager()
        self.calls: list[dict] = []

    async def async_generate(self, input_ids, sampling_params, return_logprob, **kwargs):
        self.calls.append(kwargs)
        meta = {"finish_reason": {"type": "length"}, "output_token_logprobs": [(-0.5, 7, None)]}
        return [{"text": "", "output_ids": [7], "meta_info": meta} for _ in input_ids]


@pytest.fixture
def io_struct(monkeypatch):
    """SGLang's request classes, as the stand-in's (``sglang.srt.managers.io_struct``)."""
    module = types.ModuleType("sglang.srt.managers.io_struct")
    module.LoadLoRAAdapterReqInput = LoadLoRAAdapterReqInput
    module.UnloadLoRAAdapterReqInput = UnloadLoRAAdapterReqInput
    for name in ("sglang", "sglang.srt", "sglang.srt.managers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.managers.io_struct", module)


LORA = LoraSpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"))


@pytest.fixture
def rollout(io_struct, tmp_path):
    spec = RolloutSpec(model_path=str(tmp_path / "base"), dtype="float32", lora=LORA)
    engine = SGLangRollout.__new__(SGLangRollout)  # no sglang: the parts under test only
    engine.spec, engine.config, engine.dtype = spec, SGLangConfig(), torch.float32
    engine.memory = MemoryTags(memory_saver=False, weights_backup=False, cuda_graph=False)
    engine.memory.loaded()
    engine.vocab_size, engine.max_model_len = 100, 64
    engine._warned_seed = True
    engine.vision = None  # a text model
    engine._loop = EngineLoop(FakeSGLang)
    engine.adapter = adapters.AdapterSlot(spec)
    yield engine
    engine._loop.close()
    engine.adapter.close()


def adapter_stream(seed: int, modules=("q_proj", "v_proj")):
    g = torch.Generator().manual_seed(seed)
    bucket = []
    for layer in range(2):
        for m in modules:
            prefix = f"model.layers.{layer}.self_attn.{m}"
            bucket.append((f"{prefix}.lora_A.weight", torch.randn(4, 16, generator=g)))
            bucket.append((f"{prefix}.lora_B.weight", torch.randn(16, 4, generator=g)))
    return [bucket]


def test_each_sync_swaps_the_adapter_and_requests_name_it(rollout):
    params = SamplingParams(n=2, max_tokens=1, temperature=1.0)
    rollout.generate([[1, 2]], params)
    sglang = rollout._loop.engine
    assert "lora_path" not in sglang.calls[-1]  # before the first sync: the base model

    stream = adapter_stream(0)
    rollout.load_weights(stream)
    folder = rollout.adapter._folder
    written = load_file(str(folder / "adapter_model.safetensors"))
    for name, tensor in stream[0]:
        assert torch.equal(written[f"base_model.model.{name}"], tensor)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (
        config["r"] == 4 and config["lora_alpha"] == 8.0 and config["target_modules"] == ["q_proj", "v_proj"]
    )
    rollout.generate([[1, 2]], params)
    assert sglang.calls[-1]["lora_path"] == ["rlcore-v1", "rlcore-v1"]

    rollout.load_weights(adapter_stream(1))
    assert sglang.tokenizer_manager.log == [
        ("load", "rlcore-v1"),
        ("flush", ""),
        ("unload", "rlcore-v1"),  # SGLang keeps one adapter: the old one goes first
        ("load", "rlcore-v2"),
        ("flush", ""),
    ]
    assert not folder.exists()  # the old folder is removed once SGLang dropped it
    rollout.generate([[1, 2]], params)
    assert sglang.calls[-1]["lora_path"] == ["rlcore-v2", "rlcore-v2"]


def test_an_adapter_sglang_cannot_take_is_a_clear_error(rollout):
    with pytest.raises(ValueError, match=r"adapts \['o_proj'\], which the engine made no room for"):
        rollout.load_weights(adapter_stream(0, modules=("q_proj", "o_proj")))
    rollout._loop.engine.tokenizer_manager.refuse = True
    with pytest.raises(RuntimeError, match="SGLang could not load the LoRA adapter written to .*: no room"):
        rollout.load_weights(adapter_stream(0))
