"""rlcore-vllm: a vLLM rollout engine for rlcore."""

__version__ = "0.1.0"
