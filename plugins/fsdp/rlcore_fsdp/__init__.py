"""rlcore-fsdp: a PyTorch FSDP2 training engine for rlcore."""

__version__ = "0.1.0"
