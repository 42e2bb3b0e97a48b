"""Measure the link (alpha, beta) and the reduction cost (gamma) on live ranks.

The cost model (:mod:`coursekit.costmodel`) prices one message of n bytes at

    t(n) = alpha + n beta        (alpha: latency in s, beta = 1 / bandwidth in s/B)

and the reduction of n bytes (``a += b`` on the chunk a rank receives) at ``n gamma``.
This module measures them where the work runs: on the ranks of a runner
(:mod:`coursekit.cluster.runner`: ``LocalRunner(n)`` threads or ``ClusterRunner(cluster)``
engines), so the notebooks, the preflight check, the simulator and the benchmarks all
fit the same way. Three message patterns (``pattern=``):

* ``"pingpong"`` (:func:`pingpong_times`): rank a sends n bytes to rank b, which sends
  them back; one-way time = round trip / 2. One direction busy at a time.
* ``"swap"`` (:func:`swap_times`): ranks a and b ``sendrecv`` n bytes at once, both
  directions busy: one step of a ring or of recursive doubling.
* ``"ring"`` (:func:`ring_swap_times`): every rank ``sendrecv``s n bytes to its right
  neighbour and from its left one at once, the time of the slowest rank: one ring step as
  all p ranks see it (where p ranks share fewer cores, a link is slower while all of them
  are busy, and this measures that).

and one reduction (:func:`reduce_seconds_per_byte`): gamma = seconds of ``a += b`` on
float32 arrays of n bytes, divided by n, on every rank at once (as in an allreduce step).

Every time is the median of ``repeats`` after a warm-up (typical, not best-case: what a
training step sees), and the message patterns first exchange ``WARMUP`` small messages,
then time the sizes in turns (:func:`_rounds`).
:func:`link_fit` fits ``alpha + n beta`` to the times
(:func:`coursekit.costmodel.fit`, relative errors). The runner-level calls a notebook
makes in one line are :func:`link` (-> :class:`MeasuredLink`, a ``LinkFit`` that keeps
the measured points for plotting) and :func:`gamma`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from coursekit import checks
from coursekit.collectives import reduce
from coursekit.costmodel import LinkFit, fit
from coursekit.cluster.runner import Runner

__all__ = ["PATTERNS", "SIZES", "MeasuredLink", "gamma", "link", "link_fit", "pingpong_times",
           "reduce_seconds_per_byte", "ring_swap_times", "swap_times"]

SIZES = (8, 1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22)
"""Message sizes (bytes) fitted by default: 8 B (alpha shows) to 4 MiB (beta shows)."""

PATTERNS = ("pingpong", "swap", "ring")
_TAG = 7
VISIT = 5
"""Timed calls per size in one sweep of :func:`_rounds`."""
WARMUP = 100
"""Exchanges of 1 byte before a pattern times anything, as osu_latency skips its first 100
iterations: engines that just started a task share the cores with the cluster's own
traffic for a few milliseconds, and a transport that adapts how it waits (the lanes'
``coursekit.comm.shm.Spinner``) settles meanwhile. Without them the first sizes of a
ping-pong on a 2-core machine came out 3-5x slower than the rest, and the line missed."""


def _settle(comm, right: int, left: int) -> None:
    """``WARMUP`` sendrecvs of 1 byte to ``right`` and from ``left``."""
    token, got = np.zeros(1, np.uint8), np.empty(1, np.uint8)
    for _ in range(WARMUP):
        comm.sendrecv(token, right, source=left, sendtag=_TAG, recvtag=_TAG, out=got)


def _rounds(operation, sizes, repeats: int, before=None) -> np.ndarray:
    """Seconds of ``operation(send, recv)`` on buffers of each size, shape
    (repeats, len(sizes)); ``before()`` runs untimed before each call.

    The sizes take turns in sweeps: each sweep visits every size once, for one untimed
    call (the caches and the path warm up after the previous size) and then up to
    ``VISIT`` timed ones, until each size has ``repeats``. A burst of load on a shared
    machine (another process, a browser redrawing, the cluster's own traffic) then slows
    a part of several sizes' calls instead of all the calls of one size, so each size's
    median stays what the link does and the fitted line does not zigzag.
    """
    sends = [np.zeros(max(int(n), 1), np.uint8) for n in sizes]
    recvs = [np.empty_like(send) for send in sends]
    times = np.empty((repeats, len(sizes)))
    for first in range(0, repeats, VISIT):
        for i, (send, recv) in enumerate(zip(sends, recvs)):
            for k in range(first - 1, min(first + VISIT, repeats)):
                if before is not None:
                    before()
                t0 = time.perf_counter()
                operation(send, recv)
                if k >= first:  # k = first - 1 is the visit's warm-up call
                    times[k, i] = time.perf_counter() - t0
    return times


_MIN_ALPHA, _MIN_BETA = 1e-9, 1e-15


def pingpong_times(comm, sizes=SIZES, repeats: int = 5, a: int = 0, b: int = 1):
    """One-way seconds per size between ranks ``a`` and ``b``: round trip / 2, the median
    of ``repeats`` round trips (the sizes take turns, each visit beginning with an untimed
    one: :func:`_rounds`); on rank a (None elsewhere)."""
    if comm.rank not in (a, b):
        return None
    peer = b if comm.rank == a else a
    _settle(comm, peer, peer)

    def round_trip(send, recv):  # as osu_latency: a sends, b echoes what it received
        if comm.rank == a:
            comm.send(send, peer, _TAG)
            comm.recv(peer, _TAG, out=recv)
        else:
            comm.recv(peer, _TAG, out=recv)
            comm.send(recv, peer, _TAG)

    out = np.median(_rounds(round_trip, sizes, repeats), axis=0) / 2
    return out if comm.rank == a else None


def swap_times(comm, sizes=SIZES, repeats: int = 5, a: int = 0, b: int = 1):
    """Seconds per size for ranks ``a`` and ``b`` swapping n bytes at once (``sendrecv``),
    median of ``repeats`` (sizes taking turns, :func:`_rounds`), on rank a (None
    elsewhere). This is one step of a ring or of recursive doubling: both directions busy
    at once (between ZmqComm ranks on one host each large payload is copied once, by its
    receiver: :mod:`coursekit.comm.zmq`)."""
    if comm.rank not in (a, b):
        return None
    peer = b if comm.rank == a else a
    _settle(comm, peer, peer)

    def exchange(send, recv):
        comm.sendrecv(send, peer, source=peer, sendtag=_TAG, recvtag=_TAG, out=recv)

    out = np.median(_rounds(exchange, sizes, repeats), axis=0)
    return out if comm.rank == a else None


def ring_swap_times(comm, sizes=SIZES, repeats: int = 5):
    """Seconds per size of one ring step on every rank at once: each rank ``sendrecv``s n
    bytes to its right neighbour and from its left one (median of ``repeats``, sizes
    taking turns (:func:`_rounds`), the slowest rank's time; on rank 0, None elsewhere).
    With 2 ranks it is :func:`swap_times`.

    The alpha-beta model gives every rank its own core and link. Where p ranks share
    fewer cores (4 engines on a 2-core laptop) a link is slower while all of them are
    busy; fitting alpha and beta from this measures the link as a ring step sees it.
    """
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    _settle(comm, right, left)

    def step(send, recv):
        comm.sendrecv(send, right, source=left, sendtag=_TAG, recvtag=_TAG, out=recv)

    steps = _rounds(step, sizes, repeats, before=comm.barrier)  # all ranks start together
    slowest = reduce(comm, steps, root=0, op="max", check=False)
    return np.median(slowest, axis=0) if comm.rank == 0 else None


def reduce_seconds_per_byte(comm, nbytes: int = 1 << 22, repeats: int = 5) -> float:
    """gamma on this rank: seconds of ``a += b`` on float32 arrays of ``nbytes`` bytes,
    divided by ``nbytes`` (what every allreduce step does to the chunk it receives).

    The median of ``repeats`` after one warm-up; all ranks of ``comm`` add at the same
    time (a barrier before each), as they do in an allreduce step.
    """
    a = np.ones(max(int(nbytes) // 4, 1), np.float32)
    b = np.ones_like(a)
    adds = np.empty(repeats + 1)
    for k in range(repeats + 1):  # the first add warms the caches up
        comm.barrier()
        t0 = time.perf_counter()
        a += b
        adds[k] = time.perf_counter() - t0
    return float(np.median(adds[1:])) / a.nbytes


@dataclass(frozen=True)
class MeasuredLink(LinkFit):
    """The fit ``t = alpha + n beta`` of a measured pattern, with the measured points:
    ``sizes`` (bytes) and ``times`` (seconds: one-way for "pingpong", one step for "swap"
    and "ring"), to plot beside the line ``link(sizes)``."""

    pattern: str
    sizes: np.ndarray = field(compare=False, repr=False)
    times: np.ndarray = field(compare=False, repr=False)


def link_fit(sizes, times, pattern: str = "pingpong") -> MeasuredLink:
    """alpha (s) and beta (s/B) of ``times ~ alpha + sizes beta`` (:func:`~coursekit.costmodel.fit`),
    each at least 1e-9 s and 1e-15 s/B: noise can tilt a least-squares line below zero at
    n = 0, and no link is free."""
    _check_pattern(pattern)
    sizes, times = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    f = fit(sizes, times)
    return MeasuredLink(max(f.alpha, _MIN_ALPHA), max(f.beta, _MIN_BETA), pattern, sizes, times)


def _check_pattern(pattern) -> None:
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}; allowed: {', '.join(PATTERNS)}")


def _check_sizes(sizes) -> tuple:
    n = checks.real_array(sizes, "sizes", at_least=1).ravel()
    if np.any(n != np.round(n)):
        raise ValueError(f"sizes must be whole numbers of bytes, got {n.tolist()}")
    if len(np.unique(n)) < 2:
        raise ValueError(f"sizes needs at least two different message sizes to fit alpha and "
                         f"beta, got {n.tolist()}")
    checks.fits_in_memory(2 * int(n.sum()), "sizes", "a rank's send and receive buffers")
    return tuple(int(x) for x in n)


def _check_runner(runner) -> None:
    checks.instance(runner, "runner", Runner, " (LocalRunner(n) or ClusterRunner(cluster))")


def link(runner, pattern: str = "pingpong", sizes=SIZES, repeats: int = 5, *, a: int = 0,
         b: int = 1, ranks: int | None = None) -> MeasuredLink:
    """Measure ``pattern`` (one of :data:`PATTERNS`) on ``runner``'s ranks and fit
    ``t = alpha + n beta`` to it.

    "pingpong" and "swap" run between ranks ``a`` and ``b`` (on the first max(a, b) + 1
    ranks; the others return at once); "ring" runs on the first ``ranks`` ranks (default:
    all of the runner's, at least 2). Times come back in :attr:`MeasuredLink.times`.
    """
    _check_runner(runner)
    _check_pattern(pattern)
    sizes = _check_sizes(sizes)
    repeats = checks.integer(repeats, "repeats", at_least=1)
    if pattern == "ring":
        if (a, b) != (0, 1):
            raise ValueError("a and b pick the pair for 'pingpong' and 'swap'; a 'ring' runs "
                             "on the first `ranks` ranks")
        k = runner.check_ranks(ranks)
        if k < 2:
            raise ValueError(f"a ring needs ranks >= 2, got {k}")
        times = runner.run(ring_swap_times, sizes, repeats, ranks=k)[0]
    else:
        if ranks is not None:
            raise ValueError(f"ranks= sizes the 'ring'; {pattern!r} runs between ranks a and b")
        a = checks.integer(a, "a", at_least=0, at_most=runner.size - 1)
        b = checks.integer(b, "b", at_least=0, at_most=runner.size - 1)
        if a == b:
            raise ValueError(f"a and b must be two different ranks, got a = b = {a}")
        timer = pingpong_times if pattern == "pingpong" else swap_times
        times = runner.run(timer, sizes, repeats, a, b, ranks=max(a, b) + 1)[a]
    return link_fit(sizes, times, pattern)


def gamma(runner, nbytes: int = 1 << 22, repeats: int = 5, *, ranks: int | None = None) -> float:
    """The reduction cost gamma (s/B): :func:`reduce_seconds_per_byte` on the first
    ``ranks`` ranks of ``runner`` at once (default: all), the median over the ranks."""
    _check_runner(runner)
    nbytes = checks.integer(nbytes, "nbytes", at_least=4, hint=" (one float32)")
    repeats = checks.integer(repeats, "repeats", at_least=1)
    k = runner.check_ranks(ranks)
    checks.fits_in_memory(2 * nbytes * k, "nbytes", f"the two arrays a += b of {k} ranks")
    return float(np.median(runner.run(reduce_seconds_per_byte, nbytes, repeats, ranks=k)))
