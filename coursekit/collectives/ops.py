"""Reduction operators: the ``op=`` names that reduce, allreduce and reduce_scatter accept.

Every op is an elementwise NumPy ufunc that is associative and commutative, so any
reduction tree gives the same answer up to floating-point rounding. Combining costs
gamma per byte in the alpha-beta-gamma model.
"""

from __future__ import annotations

import numpy as np

OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
"""Op name -> ufunc applied elementwise as ``ufunc(a, b, out=...)``."""


def get_op(op) -> np.ufunc:
    """Return the ufunc for ``op`` ("sum", "prod", "min" or "max")."""
    if not isinstance(op, str):
        raise TypeError(f"op must be a string, one of {sorted(OPS)}; got {op!r}")
    try:
        return OPS[op]
    except KeyError:
        raise ValueError(f"unknown op {op!r}; allowed ops: {sorted(OPS)}") from None


def combine(ufunc: np.ufunc, mine: np.ndarray, theirs: np.ndarray, theirs_first: bool) -> None:
    """``mine <- theirs op mine`` (or ``mine op theirs``) in place.

    The operand of the lower rank goes first, so every rank that combines the same two
    partial results gets bit-identical values, whatever the op.
    """
    if theirs_first:
        ufunc(theirs, mine, out=mine)
    else:
        ufunc(mine, theirs, out=mine)
