"""rlcore-rocm: the ``rocm`` device platform (AMD GPUs through a ROCm build of torch)."""
