"""Scatter and gather: the root splits an array among the ranks, or collects one from each.

Scatter splits the root's array along axis 0 into p chunks like ``np.array_split`` (the
first ``N % p`` chunks get one more row) and rank i receives chunk i. Gather is its
inverse for equal shares: rank i contributes ``x`` (same dtype and shape everywhere) and
the root gets them concatenated along axis 0 in rank order. ``nbytes`` is the root's
whole array.

* ``linear`` (default, both): the root sends (receives) p-1 messages one after the
  other: (p-1) alpha + (p-1)/p n beta.
* ``binomial_scatter`` (internal, used by the scatter_allgather broadcast): a binomial
  tree where each rank forwards the chunks of its subtree in one message:
  ceil(log2 p) alpha + (p-1)/p n beta.
"""

from __future__ import annotations

import numpy as np

from ._base import chunk_bounds, prepare
from .tags import tag


def binomial_scatter(comm, buf: np.ndarray, bounds, root: int, tag: int) -> np.ndarray:
    """In place: chunk i of ``buf`` (relative rank i = rank - root) ends on relative rank i.

    A rank with relative rank v receives chunks [v, v + lowbit(v)) from v - lowbit(v) and
    forwards [v + m, v + 2m) to v + m for each m = 2^j < lowbit(v) (the root: m < p)."""
    p = comm.size
    v = (comm.rank - root) % p
    mask = 1
    while mask < p:
        if v & mask:
            hi = min(v + mask, p)
            comm.recv((v - mask + root) % p, tag, out=buf[bounds[v]:bounds[hi]])
            break
        mask <<= 1
    mask >>= 1
    while mask:
        if v + mask < p:
            hi = min(v + 2 * mask, p)
            comm.send(buf[bounds[v + mask]:bounds[hi]], (v + mask + root) % p, tag)
        mask >>= 1
    return buf


def _linear_scatter(comm, x, root, tag):
    if comm.rank != root:
        return comm.recv(root, tag)
    b = chunk_bounds(x.shape[0], comm.size)
    for dst in range(comm.size):
        if dst != root:
            comm.send(x[b[dst]:b[dst + 1]], dst, tag)
    return x[b[root]:b[root + 1]].copy()


def _linear_gather(comm, x, root, tag):
    if comm.rank != root:
        comm.send(x, root, tag)
        return None
    rows = x.shape[0]
    out = np.empty((comm.size * rows,) + x.shape[1:], dtype=x.dtype)
    for src in range(comm.size):
        part = out[src * rows:(src + 1) * rows]
        if src == root:
            part[...] = x
        else:
            comm.recv(src, tag, out=part)
    return out


SCATTER_ALGORITHMS = {"linear": _linear_scatter}
GATHER_ALGORITHMS = {"linear": _linear_gather}
SCATTER_DEFAULT = GATHER_DEFAULT = "linear"


def scatter(comm, x, root: int = 0, algorithm: str = SCATTER_DEFAULT, *,
            check: bool = True) -> np.ndarray:
    """Rank i gets chunk i of the root's ``x`` split along axis 0 (``x`` is ignored elsewhere)."""
    call = prepare(comm, "scatter", SCATTER_ALGORITHMS, algorithm, x, root=root,
                   check=check, min_ndim=1, array_on="root")
    x = None if call.x is None else np.ascontiguousarray(call.x)
    return call.impl(comm, x, root, tag("scatter"))


def gather(comm, x, root: int = 0, algorithm: str = GATHER_DEFAULT, *,
           check: bool = True) -> np.ndarray | None:
    """The root gets every rank's ``x`` concatenated along axis 0; other ranks get None."""
    call = prepare(comm, "gather", GATHER_ALGORITHMS, algorithm, x, root=root,
                   check=check, min_ndim=1)
    return call.impl(comm, np.ascontiguousarray(call.x), root, tag("gather"))
