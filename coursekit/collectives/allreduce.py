"""Allreduce: every rank gets ``op`` applied elementwise across all ranks' arrays.

``nbytes`` = n is one rank's array; lg = ceil(log2 p); gamma is the op's cost per byte.
All algorithms leave bit-identical results on every rank.

* ``reduce_bcast``: binomial reduce to rank 0, then binomial broadcast:
  2 lg (alpha + n beta) + lg n gamma.
* ``ring`` (default; Baidu/Horovod/NCCL for large messages): ring reduce-scatter then ring
  allgather: 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma. Bandwidth-optimal.
* ``recursive_doubling``: log2 p rounds of full-vector exchange with rank XOR 2^k:
  lg (alpha + n beta + n gamma) for p a power of two. Otherwise the fold (see
  :func:`coursekit.collectives._base.fold`) adds one round in and one out:
  (floor(log2 p) + 2)(alpha + n beta) + (floor(log2 p) + 1) n gamma. Faster than the ring
  below the crossover :func:`coursekit.costmodel.crossover` computes (8 alpha/beta at p = 4,
  gamma = 0; always at p = 2); reduce_bcast never beats it.
* ``rabenseifner``: recursive-halving reduce-scatter then recursive-doubling allgather:
  2 lg alpha + 2(p-1)/p n beta + (p-1)/p n gamma for p a power of two; the fold adds
  2 alpha + 2 n beta + n gamma. MPICH's choice for long messages (recursive doubling for
  short ones; Thakur, Rabenseifner & Gropp 2005): the ring's bandwidth with 2 lg latencies.
"""

from __future__ import annotations

import numpy as np

from ._base import chunk_bounds, fold, new_rank, old_rank, prepare, work_array
from .allgather import ring_allgather
from .bcast import binomial_bcast
from .ops import combine
from .reduce import binomial_reduce
from .reduce_scatter import ring_reduce_scatter
from .tags import tag


def _reduce_bcast(comm, buf, ufunc, tag):
    binomial_reduce(comm, buf, 0, ufunc, tag)
    return binomial_bcast(comm, buf, 0, tag + 1)


def _ring(comm, buf, ufunc, tag):
    bounds = chunk_bounds(buf.size, comm.size)
    ring_reduce_scatter(comm, buf, bounds, ufunc, tag)
    return ring_allgather(comm, buf, bounds, tag + 1)


def _fold_in(comm, buf, ufunc, tag) -> bool:
    """Ranks 2i < 2*rem hand their vector to 2i+1. Returns False on the ranks that sat out
    (they then wait for the result with :func:`_fold_out`)."""
    r = comm.rank
    _, rem = fold(comm.size)
    if r >= 2 * rem:
        return True
    if r % 2 == 0:
        comm.send(buf, r + 1, tag)
        return False
    combine(ufunc, buf, comm.recv(r - 1, tag), theirs_first=True)
    return True


def _fold_out(comm, buf, active, tag):
    r = comm.rank
    _, rem = fold(comm.size)
    if r < 2 * rem:
        if active:
            comm.send(buf, r - 1, tag)
        else:
            comm.recv(r + 1, tag, out=buf)
    return buf


def _recursive_doubling(comm, buf, ufunc, tag):
    active = _fold_in(comm, buf, ufunc, tag)
    if active:
        p2, _ = fold(comm.size)
        me = new_rank(comm.rank, comm.size)
        scratch = work_array(comm, buf.size, buf.dtype)
        dist = 1
        while dist < p2:
            peer = old_rank(me ^ dist, comm.size)
            comm.sendrecv(buf, peer, source=peer, sendtag=tag + 1, recvtag=tag + 1, out=scratch)
            combine(ufunc, buf, scratch, theirs_first=peer < comm.rank)
            dist *= 2
    return _fold_out(comm, buf, active, tag + 2)


def _rabenseifner(comm, buf, ufunc, tag):
    active = _fold_in(comm, buf, ufunc, tag)
    if active:
        p2, _ = fold(comm.size)
        me = new_rank(comm.rank, comm.size)
        b = chunk_bounds(buf.size, p2)  # chunk i ends on new rank i
        scratch = work_array(comm, buf.size, buf.dtype)
        lo, hi, dist = 0, p2, p2 // 2
        while dist:  # recursive halving: keep the half named by my bit `dist`
            peer = old_rank(me ^ dist, comm.size)
            mid = lo + dist
            keep, give = ((mid, hi), (lo, mid)) if me & dist else ((lo, mid), (mid, hi))
            kept = buf[b[keep[0]]:b[keep[1]]]
            incoming = scratch[:kept.size]
            comm.sendrecv(buf[b[give[0]]:b[give[1]]], peer, source=peer, sendtag=tag + 1,
                          recvtag=tag + 1, out=incoming)
            combine(ufunc, kept, incoming, theirs_first=peer < comm.rank)
            (lo, hi), dist = keep, dist // 2
        dist = 1
        while dist < p2:  # recursive doubling: swap my range for the neighbouring one
            peer = old_rank(me ^ dist, comm.size)
            plo, phi = (lo - dist, lo) if me & dist else (hi, hi + dist)
            comm.sendrecv(buf[b[lo]:b[hi]], peer, source=peer, sendtag=tag + 2,
                          recvtag=tag + 2, out=buf[b[plo]:b[phi]])
            lo, hi, dist = min(lo, plo), max(hi, phi), dist * 2
    return _fold_out(comm, buf, active, tag + 3)


ALGORITHMS = {"ring": _ring, "reduce_bcast": _reduce_bcast,
              "recursive_doubling": _recursive_doubling, "rabenseifner": _rabenseifner}
DEFAULT = "ring"


def allreduce(comm, x, op: str = "sum", algorithm: str = DEFAULT, *,
              check: bool = True, out=None) -> np.ndarray:
    """Return ``op`` over every rank's ``x`` (same dtype and shape everywhere) on every rank.

    ``out``: a writable C-contiguous array of ``x``'s shape and dtype to receive the
    result (it is returned). ``out=x`` reduces in place, like ``MPI_IN_PLACE``: it saves
    the n-byte copy into a new result array that the alpha-beta-gamma model does not count.
    """
    call = prepare(comm, "allreduce", ALGORITHMS, algorithm, x, op=op, check=check, out=out)
    if out is None:
        out = np.array(call.x, order="C")
    elif out is not x:
        np.copyto(out, call.x)
    # every algorithm works in place on the flat view (out is C-contiguous)
    call.impl(comm, out.reshape(-1), call.ufunc, tag("allreduce"))
    return out
