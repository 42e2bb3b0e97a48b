"""Checks for exercise 02: the student's ring allreduce and binomial broadcast.

Each check runs the student's function on ThreadComm ranks (``run_local``, p = 1..6,
odd lengths, some shorter than p) and grades two things: the result (against NumPy) and
the communication volume read from the ranks' traces (against the cost model):

* ring allreduce: every rank sends 2(p-1) messages, all to the same ring neighbour, none
  larger than one chunk of ceil(n/p) items, and the ranks send 2(p-1) * n items in all,
  i.e. 2(p-1)/p * n per rank on average (any chunk assignment is accepted);
* binomial broadcast: p-1 messages of n items in all, every non-root receives exactly
  once, nobody sends more than ceil(log2 p) messages and the tree is at most
  ceil(log2 p) hops deep (any binomial tree is accepted).
"""

from __future__ import annotations

import math

import numpy as np

from coursekit import costmodel
from coursekit.comm import run_local
from coursekit.comm.trace import recording
from coursekit.grading.core import CheckFailure, check

RANKS = range(1, 7)
TIMEOUT = 5.0  # seconds a rank waits before a deadlock is reported


def _lengths(p):
    return sorted({5, 13, 2 * p + 1})


def _data(p, n, seed):
    """Small integers as float64, so that any summation order gives exact results."""
    rng = np.random.default_rng([seed, p, n])
    return [rng.integers(-50, 50, size=n).astype(np.float64) for _ in range(p)]


def _run(fn, p, make_args):
    """Run ``fn(comm, *make_args(rank))`` on p ranks; return (results, traces)."""
    def body(comm):
        with recording(comm) as messages:
            return fn(comm, *make_args(comm.rank)), list(messages())
    out = run_local(body, p, timeout=TIMEOUT)
    return [o[0] for o in out], [o[1] for o in out]


def _same(got, want, case, rank):
    try:
        ok = np.asarray(got).shape == want.shape and np.array_equal(np.asarray(got), want)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise CheckFailure(f"{case}: rank {rank} returned {got!r}, expected {want!r}")


@check("ring_allreduce")
def check_ring_allreduce(ring_allreduce, seed: int = 0):
    """``ring_allreduce(comm, x) -> sum of x over all ranks`` (same on every rank)."""
    for p in RANKS:
        for n in _lengths(p):
            xs = _data(p, n, seed)
            case = f"for p={p} ranks and x = {n} float64 per rank"
            results, traces = _run(ring_allreduce, p, lambda r: (xs[r].copy(),))
            want = np.sum(xs, axis=0)
            for rank, got in enumerate(results):
                _same(got, want, case, rank)
            _check_ring_volume(traces, p, n, case)
    return "correct sums and ring traffic for p = 1..6 ranks, odd lengths"


def _check_ring_volume(traces, p, n, case):
    item = 8
    sent = costmodel.measured_traffic(traces)
    expected_msgs = costmodel.traffic("allreduce", "ring", p, n * item, itemsize=item).messages
    for rank, trace in enumerate(traces):
        if sent.messages[rank] != expected_msgs[rank]:
            raise CheckFailure(f"{case}: rank {rank} sent {sent.messages[rank]} messages; a ring "
                               f"allreduce sends 2(p-1) = {expected_msgs[rank]} (p-1 to "
                               "reduce-scatter, p-1 to allgather)")
        peers = {m.dst for m in trace if m.op == "send"}
        if len(peers) > 1 or not peers <= {(rank + 1) % p, (rank - 1) % p}:
            raise CheckFailure(f"{case}: rank {rank} sent to ranks {sorted(peers)}; in a ring "
                               "each rank sends only to one neighbour, e.g. (rank + 1) % p")
        biggest = max((m.nbytes for m in trace if m.op == "send"), default=0)
        if biggest > math.ceil(n / p) * item:
            raise CheckFailure(f"{case}: rank {rank} sent a message of {biggest // item} items; "
                               f"a ring sends one chunk of at most ceil(n/p) = "
                               f"{math.ceil(n / p)} items per step")
    total = int(sent.nbytes.sum()) // item
    if total != 2 * (p - 1) * n:
        raise CheckFailure(f"{case}: the ranks sent {total} items in all; a ring allreduce "
                           f"sends 2(p-1)/p * n per rank, 2(p-1) * n = {2 * (p - 1) * n} in all")


@check("binomial_bcast")
def check_binomial_bcast(binomial_bcast, seed: int = 0):
    """``binomial_bcast(comm, x, root) -> the root's x`` (x is None on non-roots)."""
    for p in RANKS:
        for n in _lengths(p):
            for root in sorted({0, p - 1, p // 2}):
                x = _data(1, n, seed + root)[0]
                case = f"for p={p} ranks, root={root} and x = {n} float64"
                results, traces = _run(binomial_bcast, p,
                                       lambda r: (x.copy() if r == root else None, root))
                for rank, got in enumerate(results):
                    _same(got, x, case, rank)
                _check_tree(traces, p, n, root, case)
    return "correct results and binomial-tree traffic for p = 1..6 ranks, every root"


def _check_tree(traces, p, n, root, case):
    rounds = round(costmodel.predict("bcast", "binomial", p, 0, alpha=1.0, beta=0.0))
    parent = {}
    for rank, trace in enumerate(traces):
        sends = [m for m in trace if m.op == "send"]
        recvs = [m for m in trace if m.op == "recv"]
        if any(m.nbytes != n * 8 for m in sends):
            raise CheckFailure(f"{case}: rank {rank} sent a message that is not the whole "
                               f"array ({n * 8} bytes); a broadcast tree forwards all of it")
        if len(sends) > rounds:
            raise CheckFailure(f"{case}: rank {rank} sent {len(sends)} messages; in a binomial "
                               f"tree nobody sends more than ceil(log2 p) = {rounds}")
        want_recvs = 0 if rank == root else 1
        if len(recvs) != want_recvs:
            raise CheckFailure(f"{case}: rank {rank} received {len(recvs)} messages, expected "
                               f"{want_recvs} (each non-root receives the data exactly once)")
        if recvs:
            parent[rank] = recvs[0].src
    for rank in range(p):
        hops, node = 0, rank
        while node != root and hops <= p:
            node, hops = parent[node], hops + 1
        if hops > rounds:
            raise CheckFailure(f"{case}: the data reached rank {rank} after {hops} hops; a "
                               f"binomial tree reaches everyone in ceil(log2 p) = {rounds}")
