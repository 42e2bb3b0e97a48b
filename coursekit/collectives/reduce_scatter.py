"""Reduce-scatter: reduce every rank's array elementwise, rank i keeps chunk i.

Chunks split axis 0 like ``np.array_split`` (the first N % p get one more row).
``nbytes`` = n is one rank's whole input.

* ``linear``: rank r sends chunk j straight to rank j and combines the p-1 chunks it
  receives: (p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma.
* ``ring`` (default): p-1 steps around the ring, each passing one partially reduced
  chunk: (p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma, one message in flight per link.
"""

from __future__ import annotations

import numpy as np

from ._base import chunk_bounds, prepare, work_array
from .ops import combine
from .tags import tag


def ring_reduce_scatter(comm, buf: np.ndarray, bounds, ufunc, tag: int) -> np.ndarray:
    """In place: afterwards chunk ``rank`` of ``buf`` holds the reduction over all ranks.

    In step k rank r sends its partial chunk r-1-k to r+1 and combines chunk r-2-k from
    r-1 into its own; it sends every chunk but chunk r once."""
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    sizes = np.diff(bounds)
    scratch = work_array(comm, int(sizes.max()) if p > 1 else 0, buf.dtype)
    for k in range(p - 1):
        s, t = (r - 1 - k) % p, (r - 2 - k) % p
        incoming = scratch[:sizes[t]]
        comm.sendrecv(buf[bounds[s]:bounds[s + 1]], right, source=left, sendtag=tag,
                      recvtag=tag, out=incoming)
        combine(ufunc, buf[bounds[t]:bounds[t + 1]], incoming, theirs_first=False)
    return buf


def _linear(comm, buf, bounds, ufunc, tag):
    p, r = comm.size, comm.rank
    for dst in range(p):
        if dst != r:
            comm.send(buf[bounds[dst]:bounds[dst + 1]], dst, tag)
    mine = buf[bounds[r]:bounds[r + 1]]
    acc = np.empty_like(mine)
    scratch = work_array(comm, mine.size, mine.dtype)
    for src in range(p):
        part = mine if src == r else comm.recv(src, tag, out=scratch)
        if src == 0:
            acc[...] = part
        else:
            combine(ufunc, acc, part, theirs_first=False)
    mine[...] = acc
    return buf


ALGORITHMS = {"linear": _linear, "ring": ring_reduce_scatter}
DEFAULT = "ring"


def reduce_scatter(comm, x, op: str = "sum", algorithm: str = DEFAULT, *,
                   check: bool = True) -> np.ndarray:
    """Rank i gets chunk i (along axis 0) of ``op`` over every rank's ``x``."""
    call = prepare(comm, "reduce_scatter", ALGORITHMS, algorithm, x, op=op, check=check,
                   min_ndim=1)
    rows = call.shape[0]
    row = call.x.size // rows if rows else 0
    b = [i * row for i in chunk_bounds(rows, comm.size)]
    buf = np.array(call.x, order="C").reshape(-1)
    call.impl(comm, buf, b, call.ufunc, tag("reduce_scatter"))
    r = comm.rank
    return buf[b[r]:b[r + 1]].reshape((-1,) + call.shape[1:]).copy()
