"""rlcore-megatron: a megatron-core training engine for rlcore (TP, PP and DP with the distributed optimizer)."""

__version__ = "0.1.0"
