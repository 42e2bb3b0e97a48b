"""All-to-all: every rank splits its array into p chunks along axis 0 (like
``np.array_split``) and sends chunk j to rank j; rank r returns the chunks it received,
concatenated in rank order. ``nbytes`` = n is one rank's whole input.

* ``linear``: post all p-1 sends, then receive in rank order: (p-1) alpha + (p-1)/p n beta
  (optimistic: p-1 messages in flight at once).
* ``pairwise`` (default): p-1 rounds; in round k send to r+k and receive from r-k, one
  message in each direction per round: (p-1) alpha + (p-1)/p n beta.
"""

from __future__ import annotations

import numpy as np

from ._base import chunk_bounds, prepare
from .tags import tag


def _linear(comm, x, out, tag):
    p, r = comm.size, comm.rank
    b = chunk_bounds(x.shape[0], p)
    for dst in range(p):
        if dst != r:
            comm.send(x[b[dst]:b[dst + 1]], dst, tag)
    rows = b[r + 1] - b[r]
    for src in range(p):
        part = out[src * rows:(src + 1) * rows]
        if src == r:
            part[...] = x[b[r]:b[r + 1]]
        else:
            comm.recv(src, tag, out=part)
    return out


def _pairwise(comm, x, out, tag):
    p, r = comm.size, comm.rank
    b = chunk_bounds(x.shape[0], p)
    rows = b[r + 1] - b[r]
    out[r * rows:(r + 1) * rows] = x[b[r]:b[r + 1]]
    for k in range(1, p):
        dst, src = (r + k) % p, (r - k) % p
        comm.sendrecv(x[b[dst]:b[dst + 1]], dst, source=src, sendtag=tag, recvtag=tag,
                      out=out[src * rows:(src + 1) * rows])
    return out


ALGORITHMS = {"linear": _linear, "pairwise": _pairwise}
DEFAULT = "pairwise"


def alltoall(comm, x, algorithm: str = DEFAULT, *, check: bool = True) -> np.ndarray:
    """Exchange chunk j of every rank's ``x`` with rank j (same dtype and shape everywhere).

    Rank r returns chunk r of every rank's ``x``, stacked along axis 0 in rank order.
    """
    call = prepare(comm, "alltoall", ALGORITHMS, algorithm, x, check=check, min_ndim=1)
    x = np.ascontiguousarray(call.x)
    b = chunk_bounds(x.shape[0], comm.size)
    rows = b[comm.rank + 1] - b[comm.rank]
    out = np.empty((comm.size * rows,) + x.shape[1:], dtype=x.dtype)
    return call.impl(comm, x, out, tag("alltoall"))
