"""rlcore-sglang: an SGLang rollout engine for rlcore."""

__version__ = "0.1.0"
