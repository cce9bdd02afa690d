"""What crosses between roles names only core's types (rlcore.cluster.neutral): batches, tensors,
numpy arrays and plain data pass; a plugin's class, a library's object or a test's function is named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rlcore.api import Batch
from rlcore.cluster.neutral import ForeignData, check_neutral, foreign_types
from rlcore.cluster.wire import to_wire
from rlcore.cluster.workers import WorkerError


def test_batches_tensors_arrays_and_plain_data_are_neutral():
    batch = Batch({"input_ids": torch.arange(6).view(2, 3), "mask": torch.ones(2, 3, dtype=torch.bfloat16)})
    batch.objects["text"] = ["a", "b"]
    value = {"batch": to_wire(batch), "plain": batch, "x": np.zeros(3), "m": {"loss": 1.5}, "t": (1, None)}
    assert foreign_types(value) == set()
    check_neutral(WorkerError("rollout", 0, "generate", "boom"), "an error")


def test_a_librarys_object_a_plugins_class_and_a_local_function_are_named():
    from rlcore_vllm.config import VLLMConfig
    from transformers import LlamaConfig

    found = foreign_types(
        {"config": LlamaConfig(hidden_size=64, num_attention_heads=4), "section": VLLMConfig()}
    )
    assert "transformers.models.llama.configuration_llama.LlamaConfig" in found
    assert "rlcore_vllm.config.VLLMConfig" in found

    def local(x):
        return x

    assert any(name.endswith("local") for name in foreign_types([local]))
    with pytest.raises(
        ForeignData, match=r"the result of rollout.generate carries types of a plugin or library"
    ):
        check_neutral(LlamaConfig(), "the result of rollout.generate")
