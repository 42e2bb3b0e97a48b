"""Tiny SPMD programs on the Comm API, importable on engines and spawned processes.

Used by the chapter-2 notebook, the tests and ``bench/bench_p2p.py``.
"""

from __future__ import annotations

import numpy as np

from .trace import now


def ring_exchange(comm, n: int = 4) -> np.ndarray:
    """Pass ``arange(n) + 100*rank`` one step to the right; return what came from the left."""
    x = np.arange(n, dtype=np.float64) + 100 * comm.rank
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    return comm.sendrecv(x, right, source=left)


def ping_pong(comm, nbytes: int, iters: int, warmup: int = 10, out: bool = True) -> float:
    """Mean one-way time in seconds of an ``nbytes`` message between ranks 0 and 1.

    One-way time = round trip / 2; the alpha-beta model says it is alpha + nbytes * beta.
    Ranks other than 0 and 1 return 0.0. ``out=True`` receives into a preallocated buffer.
    """
    if comm.rank > 1:
        return 0.0
    peer = 1 - comm.rank
    msg = np.zeros(nbytes, np.uint8)
    buf = np.empty_like(msg) if out else None
    for i in range(warmup + iters):
        if i == warmup:
            t0 = now()
        if comm.rank == 0:
            comm.send(msg, peer)
            comm.recv(peer, out=buf)
        else:
            comm.recv(peer, out=buf)
            comm.send(msg, peer)
    return (now() - t0) / iters / 2
