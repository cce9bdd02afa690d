"""Tolerances for comparing two floating-point computations of the same quantity, derived from the dtype
and the length of the reductions involved, never from one CPU's rounding.

Two correct computations that sum the same ``n`` terms in different orders (chunked vs whole, packed vs
padded, another CPU's vectorisation) differ by rounding alone. For sums of terms of size ``scale`` the
rounding error of each behaves like a random walk of ``n`` steps of at most one unit roundoff ``u``
(Higham & Mary, "A new approach to probabilistic rounding error analysis", 2019): with overwhelming
probability below ``lam * sqrt(n) * u * scale`` with ``lam`` a small constant. The difference of two such
results is at most twice that. A network chains several reductions (hidden size in every matmul, the
vocabulary in the softmax), so ``n`` is their total along the path.

>>> import torch
>>> round(reduction_atol(torch.float32, 1024) / torch.finfo(torch.float32).eps, 1)
256.0
"""

from __future__ import annotations

import math

import torch

#: Standard deviations of the random-walk bound: the chance to exceed it is below exp(-LAMBDA**2 / 2).
LAMBDA = 4.0


def reduction_atol(dtype: torch.dtype, n: int, scale: float = 1.0) -> float:
    """Absolute tolerance for two results that each reduce ``n`` terms of magnitude ``scale`` in
    ``dtype``, in different orders: ``2 * LAMBDA * sqrt(n) * eps(dtype) * scale``."""
    eps = torch.finfo(dtype).eps
    return 2 * LAMBDA * math.sqrt(n) * eps * scale
