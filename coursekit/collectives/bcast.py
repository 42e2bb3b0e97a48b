"""Broadcast: the root's array ends on every rank. ``nbytes`` = n is the array's size.

* ``linear``: the root sends the whole array to each rank in turn: (p-1)(alpha + n beta).
* ``binomial`` (default): a binomial tree; the set of ranks holding the data doubles every
  round: ceil(log2 p)(alpha + n beta). Best for small messages.
* ``scatter_allgather`` (van de Geijn): binomial scatter of p chunks, then ring allgather:
  (ceil(log2 p) + p - 1) alpha + 2 (p-1)/p n beta. Best for large messages.
"""

from __future__ import annotations

import numpy as np

from ._base import chunk_bounds, prepare
from .allgather import ring_allgather
from .scatter_gather import binomial_scatter
from .tags import tag


def binomial_bcast(comm, buf: np.ndarray, root: int, tag: int) -> np.ndarray:
    """In place. Relative rank v = rank - root receives from v - lowbit(v), then sends to
    v + m for m = lowbit(v)/2, lowbit(v)/4, ..., 1 (the root: every power of two < p)."""
    p = comm.size
    v = (comm.rank - root) % p
    mask = 1
    while mask < p:
        if v & mask:
            comm.recv((v - mask + root) % p, tag, out=buf)
            break
        mask <<= 1
    mask >>= 1
    while mask:
        if v + mask < p:
            comm.send(buf, (v + mask + root) % p, tag)
        mask >>= 1
    return buf


def _linear(comm, buf, root, tag):
    if comm.rank == root:
        for dst in range(comm.size):
            if dst != root:
                comm.send(buf, dst, tag)
    else:
        comm.recv(root, tag, out=buf)
    return buf


def _scatter_allgather(comm, buf, root, tag):
    bounds = chunk_bounds(buf.size, comm.size)  # chunk i belongs to relative rank i
    binomial_scatter(comm, buf, bounds, root, tag)
    return ring_allgather(comm, buf, bounds, tag + 1, first=root)


ALGORITHMS = {"linear": _linear, "binomial": binomial_bcast,
              "scatter_allgather": _scatter_allgather}
DEFAULT = "binomial"


def bcast(comm, x, root: int = 0, algorithm: str = DEFAULT, *, check: bool = True) -> np.ndarray:
    """Return a copy of the root's ``x`` on every rank.

    Non-root ranks pass None (with ``check=True``) or a buffer of the root's dtype and
    shape, whose values are ignored; it is not modified.
    """
    call = prepare(comm, "bcast", ALGORITHMS, algorithm, x, root=root, check=check,
                   array_on="root+")
    if comm.rank == root:
        buf = np.array(call.x, order="C").reshape(-1)
    else:
        buf = np.empty(int(np.prod(call.shape)), dtype=call.dtype)
    return call.impl(comm, buf, root, tag("bcast")).reshape(call.shape)
