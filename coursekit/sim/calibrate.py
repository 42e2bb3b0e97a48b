"""Measure a link's alpha and beta (ping-pong, exchange, ring step), to feed the models.

:func:`pingpong_times` runs on every rank of a Comm (engines, MPI ranks, ThreadComm ranks): rank
``a`` sends n bytes to rank ``b``, which sends them back; one-way time = round trip / 2,
the median of ``repeats`` (typical, not best-case: what a training step sees). :func:`coursekit.costmodel.fit` turns the times into ``alpha + n beta``.
"""

from __future__ import annotations

import time

import numpy as np

from coursekit.collectives import reduce
from coursekit.costmodel import LinkFit, fit

__all__ = ["SIZES", "link_fit", "pingpong_times", "ring_swap_times", "swap_times"]

SIZES = (8, 1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22)
_TAG = 7


def pingpong_times(comm, sizes=SIZES, repeats: int = 5, a: int = 0, b: int = 1):
    """One-way seconds per size between ranks ``a`` and ``b`` (on rank a; None elsewhere)."""
    if comm.rank not in (a, b):
        return None
    peer = b if comm.rank == a else a
    out = np.empty(len(sizes))
    for i, n in enumerate(sizes):
        buf = np.zeros(max(int(n), 1), dtype=np.uint8)
        trips = []
        for _ in range(repeats + 1):  # the first round trip warms the connection up
            t0 = time.perf_counter()
            if comm.rank == a:
                comm.send(buf, peer, _TAG)
                comm.recv(peer, _TAG, out=buf)
            else:
                comm.recv(peer, _TAG, out=buf)
                comm.send(buf, peer, _TAG)
            trips.append(time.perf_counter() - t0)
        out[i] = np.median(trips[1:]) / 2
    return out if comm.rank == a else None


def swap_times(comm, sizes=SIZES, repeats: int = 5, a: int = 0, b: int = 1):
    """Seconds per size for ranks ``a`` and ``b`` swapping n bytes at once (``sendrecv``),
    median of ``repeats``, on rank a (None elsewhere). This is one step of a ring or of
    recursive doubling: both directions busy at once. Between ZmqComm ranks on one host
    large payloads go by single copy here (:mod:`coursekit.comm.zmq`), so its beta is
    smaller than the ping-pong's, which goes over TCP."""
    if comm.rank not in (a, b):
        return None
    peer = b if comm.rank == a else a
    out = np.empty(len(sizes))
    for i, n in enumerate(sizes):
        send, recv = np.zeros(max(int(n), 1), np.uint8), np.empty(max(int(n), 1), np.uint8)
        swaps = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            comm.sendrecv(send, peer, source=peer, sendtag=_TAG, recvtag=_TAG, out=recv)
            swaps.append(time.perf_counter() - t0)
        out[i] = np.median(swaps[1:])
    return out if comm.rank == a else None


def ring_swap_times(comm, sizes=SIZES, repeats: int = 5):
    """Seconds per size of one ring step on every rank at once: each rank ``sendrecv``s n
    bytes to its right neighbour and from its left one (median of ``repeats``, the
    slowest rank's time; on rank 0, None elsewhere). With 2 ranks it is :func:`swap_times`.

    The alpha-beta model gives every rank its own core and link. Where p ranks share
    fewer cores (4 engines on a 2-core laptop) a link is slower while all of them are
    busy; fitting alpha and beta from this measures the link as a ring step sees it.
    """
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    out = np.empty(len(sizes))
    for i, n in enumerate(sizes):
        send, recv = np.zeros(max(int(n), 1), np.uint8), np.empty(max(int(n), 1), np.uint8)
        steps = np.empty(repeats + 1)
        for k in range(repeats + 1):  # the first step warms the connections up
            comm.barrier()
            t0 = time.perf_counter()
            comm.sendrecv(send, right, source=left, sendtag=_TAG, recvtag=_TAG, out=recv)
            steps[k] = time.perf_counter() - t0
        slowest = reduce(comm, steps[1:], root=0, op="max", check=False)
        if comm.rank == 0:
            out[i] = np.median(slowest)
    return out if comm.rank == 0 else None


def link_fit(sizes, one_way) -> LinkFit:
    """alpha (s) and beta (s/B) from :func:`pingpong_times`'s or :func:`swap_times`'s times; alpha clipped at 1 ns."""
    f = fit(np.asarray(sizes, dtype=float), one_way)
    return LinkFit(max(f.alpha, 1e-9), max(f.beta, 1e-15))
