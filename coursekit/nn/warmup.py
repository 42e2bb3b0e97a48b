"""Get the Numba kernels ready before the first training step, and say so while it happens.

``@njit(cache=True)`` compiles each kernel for each argument type the first time it is
called and stores the machine code in ``__pycache__``. The first run of the course on a
machine therefore sits silent for several seconds (10-30 s on a laptop) inside whatever
cell first trains; later sessions load the code from the cache in well under a second.
:func:`warm_up` does that work up front, in one cell, after printing a notice, and reports
whether the kernels were compiled or loaded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.nn import kernels_cpu
from coursekit.nn.mlp import MLP
from coursekit.nn.optim import SGD

__all__ = ["WarmUp", "warm_up"]

NOTICE = ("Preparing coursekit's Numba kernels: compiled for this machine the first time "
          "(10-30 s on a laptop), loaded from the cache afterwards ...")
# the entry points a training step calls; their own callees are compiled with them
ENTRY_POINTS = ("loss_and_grad_xent", "forward", "sgd_update", "all_finite", "labels_in_range")


@dataclass(frozen=True)
class WarmUp:
    """How long getting the kernels ready took, and how many signatures had to be compiled."""

    seconds: float
    compiled: int

    def __str__(self) -> str:
        how = f"compiled {self.compiled} kernel signatures" if self.compiled else "nothing to compile: cached"
        return f"Numba kernels ready in {self.seconds:.1f} s ({how})"


def warm_up(dtypes=(np.float32, np.float64), *, announce=print) -> WarmUp:
    """Compile or load the CPU kernels for ``dtypes``; ``announce(NOTICE)`` first.

    Runs one tiny forward, backward and SGD update per dtype. ``announce=None`` stays silent.
    """
    checks.callback(announce, "announce", "(text)")
    dtypes = [checks.float_dtype(dtype, "dtypes") for dtype in dtypes]
    if announce is not None:
        announce(NOTICE)
    misses_before = _cache_misses()
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    for dtype in dtypes:
        mlp = MLP([4, 3, 2], seed=0, dtype=dtype)
        X = rng.standard_normal((2, 4)).astype(mlp.dtype)
        _, grad = mlp.loss_and_grad(X, np.array([0, 1]))
        SGD(mlp.params, 0.1).step(grad)
        mlp.forward(X)
    return WarmUp(time.perf_counter() - started, _cache_misses() - misses_before)


def _cache_misses() -> int:
    """Signatures Numba compiled so far in this process (not found in its cache)."""
    return sum(sum(getattr(kernels_cpu, name).stats.cache_misses.values()) for name in ENTRY_POINTS)
