"""Fixtures for the megatron engine tests: tiny HF models, a padded batch, and a gloo process spawner.

Megatron runs only inside spawned worker processes (``mcore_test_workers``), which install the CPU
redirection of :mod:`mcore_cpu_redirect` first; the pytest process itself never touches megatron-core's
process groups or ``torch.cuda``. HF references are computed here, in the pytest process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# The spawned workers import their entry points by module name; spawn children inherit sys.path.
TESTS_DIR = str(Path(__file__).parent)
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)


def pytest_configure(config):
    config.addinivalue_line("markers", "distributed: spawns several gloo worker processes")


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory) -> Path:
    from rlcore.testing.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen"))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A random Llama (untied, no biases, GQA, vocab 1000: padded to 1024 inside Megatron)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny_llama")
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    torch.manual_seed(1)
    LlamaForCausalLM(config).save_pretrained(str(path))
    return path
