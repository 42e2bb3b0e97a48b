"""Allgather: every rank ends with the concatenation (along axis 0, in rank order) of all
ranks' arrays. ``nbytes`` below is the size of that result, m = n/p each rank's share.

* ``linear``: every rank sends its block to every other rank.
  (p-1) alpha + (p-1)/p n beta (assuming a rank can send and receive at once).
* ``ring`` (default): p-1 steps; in step k rank r passes block r-k to r+1.
  (p-1) alpha + (p-1)/p n beta: bandwidth-optimal, latency linear in p.
* ``recursive_doubling``: log2 p steps exchanging ever larger contiguous ranges with
  rank XOR 2^k. p a power of two: log2 p alpha + (p-1)/p n beta. Otherwise the standard
  fold: ranks 2i < 2*rem hand their block to 2i+1 first and get the full result back at
  the end: (floor(log2 p) + 2) alpha + (1/p + (p-1)/p + 1) n beta.
"""

from __future__ import annotations

import numpy as np

from ._base import fold, new_rank, old_rank, prepare
from .tags import tag


def ring_allgather(comm, buf: np.ndarray, bounds, tag: int, first: int = 0) -> np.ndarray:
    """Ring allgather in place: block i (``buf[bounds[i]:bounds[i+1]]``) starts on rank
    ``(i + first) % p`` and ends on every rank. Each rank sends p-1 blocks, all but
    block ``v + 1`` where v = rank - first."""
    p = comm.size
    v = (comm.rank - first) % p
    right, left = (comm.rank + 1) % p, (comm.rank - 1) % p
    for k in range(p - 1):
        s, t = (v - k) % p, (v - k - 1) % p
        comm.sendrecv(buf[bounds[s]:bounds[s + 1]], right, source=left, sendtag=tag,
                      recvtag=tag, out=buf[bounds[t]:bounds[t + 1]])
    return buf


def _linear(comm, buf, bounds, tag):
    r = comm.rank
    for dst in range(comm.size):
        if dst != r:
            comm.send(buf[bounds[r]:bounds[r + 1]], dst, tag)
    for src in range(comm.size):
        if src != r:
            comm.recv(src, tag, out=buf[bounds[src]:bounds[src + 1]])
    return buf


def _ring(comm, buf, bounds, tag):
    return ring_allgather(comm, buf, bounds, tag)


def _recursive_doubling(comm, buf, bounds, tag):
    p, r = comm.size, comm.rank
    p2, rem = fold(p)
    if r < 2 * rem and r % 2 == 0:  # folded out: hand over the block, get everything back
        comm.send(buf[bounds[r]:bounds[r + 1]], r + 1, tag)
        comm.recv(r + 1, tag + 2, out=buf)
        return buf
    if r < 2 * rem:
        comm.recv(r - 1, tag, out=buf[bounds[r - 1]:bounds[r]])
    me = new_rank(r, p)

    def first(new):  # first old rank whose block new rank `new` holds (new <= p2)
        return 2 * new if new < rem else new + rem

    dist = 1
    while dist < p2:
        mine = me & ~(dist - 1)  # my group of new ranks [mine, mine + dist)
        theirs = mine ^ dist
        peer = old_rank(me ^ dist, p)
        send = buf[bounds[first(mine)]:bounds[first(mine + dist)]]
        recv = buf[bounds[first(theirs)]:bounds[first(theirs + dist)]]
        comm.sendrecv(send, peer, source=peer, sendtag=tag + 1, recvtag=tag + 1, out=recv)
        dist *= 2
    if r < 2 * rem:
        comm.send(buf, r - 1, tag + 2)
    return buf


ALGORITHMS = {"linear": _linear, "ring": _ring, "recursive_doubling": _recursive_doubling}
DEFAULT = "ring"


def allgather(comm, x, algorithm: str = DEFAULT, *, check: bool = True) -> np.ndarray:
    """Concatenate every rank's ``x`` along axis 0 (same dtype and shape everywhere).

    Returns an array of shape ``(p * x.shape[0], *x.shape[1:])`` on every rank.
    """
    call = prepare(comm, "allgather", ALGORITHMS, algorithm, x, check=check, min_ndim=1)
    p, m = comm.size, call.x.size
    buf = np.empty(p * m, dtype=call.x.dtype)
    buf[comm.rank * m:(comm.rank + 1) * m] = call.x.ravel()
    call.impl(comm, buf, [i * m for i in range(p + 1)], tag("allgather"))
    return buf.reshape((p * call.x.shape[0],) + call.x.shape[1:])
