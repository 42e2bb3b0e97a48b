"""Reduce: the root gets ``op`` applied elementwise across every rank's array.

``nbytes`` = n is one rank's array; gamma is the cost per byte of applying the op.

* ``linear``: every rank sends to the root, which combines the p-1 arrays in rank order:
  (p-1)(alpha + n beta + n gamma).
* ``binomial`` (default): a binomial tree, the mirror image of the binomial broadcast:
  ceil(log2 p)(alpha + n beta + n gamma).
"""

from __future__ import annotations

import numpy as np

from ._base import prepare, work_array
from .ops import combine
from .tags import tag


def binomial_reduce(comm, buf: np.ndarray, root: int, ufunc, tag: int) -> np.ndarray:
    """In place; the result is valid on the root only. Relative rank v combines what its
    children v + 1, v + 2, v + 4, ... (below lowbit(v)) send, then sends to v - lowbit(v)."""
    p = comm.size
    v = (comm.rank - root) % p
    scratch = work_array(comm, buf.size, buf.dtype).reshape(buf.shape)
    mask = 1
    while mask < p:
        if v & mask:
            comm.send(buf, (v - mask + root) % p, tag)
            break
        if v + mask < p:
            comm.recv((v + mask + root) % p, tag, out=scratch)
            combine(ufunc, buf, scratch, theirs_first=False)
        mask <<= 1
    return buf


def _linear(comm, buf, root, ufunc, tag):
    if comm.rank != root:
        comm.send(buf, root, tag)
        return buf
    acc = np.empty_like(buf)
    scratch = work_array(comm, buf.size, buf.dtype).reshape(buf.shape)
    for src in range(comm.size):
        part = buf if src == root else comm.recv(src, tag, out=scratch)
        if src == 0:
            acc[...] = part
        else:
            combine(ufunc, acc, part, theirs_first=False)
    return acc


ALGORITHMS = {"linear": _linear, "binomial": binomial_reduce}
DEFAULT = "binomial"


def reduce(comm, x, root: int = 0, op: str = "sum", algorithm: str = DEFAULT, *,
           check: bool = True) -> np.ndarray | None:
    """The root gets ``op`` over every rank's ``x`` (same dtype and shape everywhere);
    other ranks get None."""
    call = prepare(comm, "reduce", ALGORITHMS, algorithm, x, root=root, op=op, check=check)
    buf = np.array(call.x, order="C").reshape(-1)
    out = call.impl(comm, buf, root, call.ufunc, tag("reduce"))
    return out.reshape(call.shape) if comm.rank == root else None
