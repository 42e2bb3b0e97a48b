"""The alpha-beta-gamma cost model of point-to-point messages and collectives.

One message of n bytes costs ``t = alpha + n * beta`` (the lecture's t = l + size/bw:
alpha is the latency l, beta = 1/bw); combining n bytes with a reduction op costs
``n * gamma``. The formulas below are those of Thakur, Rabenseifner & Gropp,
"Optimization of Collective Communication Operations in MPICH" (IJHPCA 2005), for the
algorithms in :mod:`coursekit.collectives`, with p ranks, lg = ceil(log2 p),
fl = floor(log2 p) and f = (p-1)/p:

==============  ==================  ===========================================================
collective      algorithm           time
==============  ==================  ===========================================================
bcast           linear              (p-1)(alpha + n beta)
bcast           binomial            lg (alpha + n beta)
bcast           scatter_allgather   (lg + p - 1) alpha + 2 f n beta
scatter         linear              (p-1) alpha + f n beta
gather          linear              (p-1) alpha + f n beta
reduce          linear              (p-1)(alpha + n beta + n gamma)
reduce          binomial            lg (alpha + n beta + n gamma)
allreduce       reduce_bcast        2 lg (alpha + n beta) + lg n gamma
allreduce       ring                2(p-1) alpha + 2 f n beta + f n gamma
allreduce       recursive_doubling  lg (alpha + n beta + n gamma)                 (p = 2^k)
                                    (fl + 2)(alpha + n beta) + (fl + 1) n gamma   (otherwise)
allreduce       rabenseifner        2 fl alpha + 2 f' n beta + f' n gamma, f' = (p'-1)/p',
                                    p' = 2^fl, plus 2 alpha + 2 n beta + n gamma if p != p'
reduce_scatter  linear, ring        (p-1) alpha + f n beta + f n gamma
allgather       linear, ring        (p-1) alpha + f n beta
allgather       recursive_doubling  lg alpha + f n beta (p = 2^k); (fl + 2) alpha + 2 n beta
alltoall        linear, pairwise    (p-1) alpha + f n beta
==============  ==================  ===========================================================

``n`` is always the size of the whole vector: the broadcast/reduced array, the root's
array for scatter and gather, the gathered result for allgather, one rank's input for
reduce_scatter and alltoall (the nccl-tests convention, so :func:`busbw` applies).
The linear allgather and alltoall lines assume a rank can keep p-1 messages in flight.

:func:`traffic` gives the exact number of messages and bytes every rank sends in our
implementation, which the tests compare with the traced runs.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from math import ceil, floor, log2

import numpy as np

from coursekit import checks


def _lg(p):
    return ceil(log2(p)) if p > 1 else 0


def _fl(p):
    return floor(log2(p))


def _rd_allreduce(p, n, a, b, g):
    if p & (p - 1) == 0:
        return _lg(p) * (a + n * b + n * g)
    return (_fl(p) + 2) * (a + n * b) + (_fl(p) + 1) * n * g


def _rabenseifner(p, n, a, b, g):
    p2 = 1 << _fl(p)
    f2 = (p2 - 1) / p2
    core = 2 * _fl(p) * a + 2 * f2 * n * b + f2 * n * g
    return core if p == p2 else core + 2 * a + 2 * n * b + n * g


def _rd_allgather(p, n, a, b, g):
    if p & (p - 1) == 0:
        return _lg(p) * a + (p - 1) / p * n * b
    return (_fl(p) + 2) * a + 2 * n * b


def _linear_f(p, n, a, b, g):  # (p-1) alpha + f n beta
    return (p - 1) * a + (p - 1) / p * n * b


def _linear_fg(p, n, a, b, g):  # (p-1) alpha + f n (beta + gamma)
    return (p - 1) * a + (p - 1) / p * n * (b + g)


FORMULAS = {
    ("bcast", "linear"): lambda p, n, a, b, g: (p - 1) * (a + n * b),
    ("bcast", "binomial"): lambda p, n, a, b, g: _lg(p) * (a + n * b),
    ("bcast", "scatter_allgather"):
        lambda p, n, a, b, g: (_lg(p) + p - 1) * a + 2 * (p - 1) / p * n * b,
    ("scatter", "linear"): _linear_f,
    ("gather", "linear"): _linear_f,
    ("reduce", "linear"): lambda p, n, a, b, g: (p - 1) * (a + n * b + n * g),
    ("reduce", "binomial"): lambda p, n, a, b, g: _lg(p) * (a + n * b + n * g),
    ("allreduce", "reduce_bcast"):
        lambda p, n, a, b, g: 2 * _lg(p) * (a + n * b) + _lg(p) * n * g,
    ("allreduce", "ring"):
        lambda p, n, a, b, g: 2 * (p - 1) * a + (p - 1) / p * n * (2 * b + g),
    ("allreduce", "recursive_doubling"): _rd_allreduce,
    ("allreduce", "rabenseifner"): _rabenseifner,
    ("reduce_scatter", "linear"): _linear_fg,
    ("reduce_scatter", "ring"): _linear_fg,
    ("allgather", "linear"): _linear_f,
    ("allgather", "ring"): _linear_f,
    ("allgather", "recursive_doubling"): _rd_allgather,
    ("alltoall", "linear"): _linear_f,
    ("alltoall", "pairwise"): _linear_f,
}
"""(collective, algorithm) -> f(p, n, alpha, beta, gamma) in seconds."""


def _check(collective, algorithm, p, nbytes):
    algos = sorted(a for c, a in FORMULAS if c == collective)
    if not algos:
        raise ValueError(f"unknown collective {collective!r}; allowed: "
                         f"{sorted({c for c, _ in FORMULAS})}")
    if algorithm not in algos:
        raise ValueError(f"unknown {collective} algorithm {algorithm!r}; allowed: {algos}")
    checks.integer(p, "p", at_least=1, hint=" (the number of ranks, a positive int)")
    return checks.real_array(nbytes, "nbytes", at_least=0)


def predict(collective: str, algorithm: str, p: int, nbytes, alpha: float, beta: float,
            gamma: float = 0.0):
    """Predicted time (s) of ``collective`` with ``algorithm`` on p ranks for n = ``nbytes``.

    ``nbytes`` may be an array (one prediction per size). alpha in s, beta and gamma in s/B:
    finite numbers (a fitted alpha may come out slightly negative, so the sign is not checked).
    """
    n = _check(collective, algorithm, p, nbytes)
    alpha, beta, gamma = (checks.real(v, k) for k, v in
                          (("alpha", alpha), ("beta", beta), ("gamma", gamma)))
    return FORMULAS[collective, algorithm](int(p), n if n.ndim else float(n), alpha, beta, gamma)


def crossover(collective: str, first: str, second: str, p: int, alpha: float, beta: float,
              gamma: float = 0.0) -> float:
    """The message size n (bytes) above which ``second`` is predicted faster than ``first``.

    Every formula is a line in n, t = A + B n (A: the alpha terms, B: the beta and gamma
    terms), so the two cross once, at n* = (A_second - A_first) / (B_first - B_second):
    ``first`` is faster below n*, ``second`` above it. Returns ``math.inf`` if ``second`` is
    never faster (it loses or ties at every n), ``0.0`` if it is never slower. A ValueError
    if the order is the other way round (``second`` faster below n*, ``first`` above): swap
    the names. Allreduce, p = 4, gamma = 0: recursive doubling (2 alpha + 2 n beta) beats
    the ring (6 alpha + 1.5 n beta) below n* = 8 alpha / beta; in general (p a power of two)
    n* = (2(p-1) - lg p) alpha / ((lg p - 2(p-1)/p) beta + (lg p - (p-1)/p) gamma).
    """
    for name in (first, second):
        _check(collective, name, p, 0)
    alpha, beta, gamma = (checks.real(v, k) for k, v in
                          (("alpha", alpha), ("beta", beta), ("gamma", gamma)))
    probe = float(1 << 30)  # the formulas are exact lines: two points give A and B

    def line(algorithm):
        t0 = FORMULAS[collective, algorithm](int(p), 0.0, alpha, beta, gamma)
        return t0, (FORMULAS[collective, algorithm](int(p), probe, alpha, beta, gamma) - t0) / probe

    (a1, b1), (a2, b2) = line(first), line(second)
    tol = 1e-12 * max(abs(b1), abs(b2), 1e-300)
    if abs(b1 - b2) <= tol:  # parallel lines: the latency terms decide at every n
        return 0.0 if a2 <= a1 else math.inf
    n = (a2 - a1) / (b1 - b2)
    if b2 < b1:  # second grows more slowly: it wins above n
        return max(n, 0.0)
    if n <= 0:  # second grows faster and already starts no lower: it never wins
        return math.inf
    raise ValueError(f"{collective}: {second!r} is faster than {first!r} below n = {n:.4g} B "
                     f"and slower above it; call crossover(..., {second!r}, {first!r}, ...)")


# ---- exact traffic ----------------------------------------------------------------------

@dataclass(frozen=True)
class Traffic:
    """What every rank sends: ``messages[r]`` messages carrying ``nbytes[r]`` bytes in all."""

    messages: np.ndarray
    nbytes: np.ndarray


def _chunks(n, p):
    q, r = divmod(n, p)
    return np.array([q + 1] * r + [q] * (p - r), dtype=np.int64)


def _children(v, p):
    """Binomial-tree children of relative rank v: v + m for m = 2^j below lowbit(v)."""
    top = (v & -v) if v else 1 << _lg(p)
    return [v + m for m in (1 << j for j in range(_lg(p))) if m < top and v + m < p]


def _binomial_bcast(p, n, root):
    msgs, items = np.zeros(p, np.int64), np.zeros(p, np.int64)
    for v in range(p):
        k = len(_children(v, p))
        msgs[(v + root) % p], items[(v + root) % p] = k, k * n
    return msgs, items


def _scatter_allgather(p, n, root):
    c = _chunks(n, p)
    msgs, items = np.zeros(p, np.int64), np.zeros(p, np.int64)
    for v in range(p):
        kids = _children(v, p)
        scatter = sum(int(c[k:min(2 * k - v, p)].sum()) for k in kids)  # subtree [k, k + (k - v))
        r = (v + root) % p
        msgs[r] = len(kids) + (p - 1)
        items[r] = scatter + (n - c[(v + 1) % p] if p > 1 else 0)
    return msgs, items


def _binomial_reduce(p, n, root):
    msgs = np.array([int((r - root) % p != 0) for r in range(p)], np.int64)
    return msgs, msgs * n


def _fold_counts(p, n_in, n_out, core):
    """Messages/items of fold-in (``n_in`` items), ``core(new_rank)`` and fold-out (``n_out``)."""
    p2, rem = 1 << _fl(p), p - (1 << _fl(p))
    msgs, items = np.zeros(p, np.int64), np.zeros(p, np.int64)
    for r in range(p):
        if r < 2 * rem and r % 2 == 0:
            msgs[r], items[r] = 1, n_in
            continue
        m, i = core(r // 2 if r < 2 * rem else r - rem, p2, rem)
        extra = int(r < 2 * rem)
        msgs[r], items[r] = m + extra, i + extra * n_out
    return msgs, items


def _rabenseifner_counts(p, n):
    def core(me, p2, rem):
        c = _chunks(n, p2)  # chunk i ends on new rank i
        lo, hi, dist, sent = 0, p2, p2 // 2, 0
        while dist:  # recursive halving: send the half that my bit `dist` does not name
            mid = lo + dist
            give, keep = ((lo, mid), (mid, hi)) if me & dist else ((mid, hi), (lo, mid))
            sent += int(c[give[0]:give[1]].sum())
            (lo, hi), dist = keep, dist // 2
        dist = 1
        while dist < p2:  # recursive doubling: send my aligned range of `dist` chunks
            first = me & ~(dist - 1)
            sent += int(c[first:first + dist].sum())
            dist *= 2
        return 2 * _fl(p), sent
    return _fold_counts(p, n, n, core)


def _rd_allgather_counts(p, n):
    m = n // p

    def core(me, p2, rem):
        def first(new):  # first old rank whose block new rank `new` holds
            return 2 * new if new < rem else new + rem

        sent = 0
        for k in range(_fl(p)):  # step k: send the blocks of my aligned group of 2^k
            g = me & ~((1 << k) - 1)
            sent += (first(g + (1 << k)) - first(g)) * m
        return _fl(p), sent
    return _fold_counts(p, m, n, core)


def _all_but(n, p, skip):
    """Each rank sends p-1 messages: every chunk of n but chunk ``skip(r)``."""
    c = _chunks(n, p)
    msgs = np.full(p, p - 1, np.int64)
    items = np.array([n - c[skip(r) % p] if p > 1 else 0 for r in range(p)], np.int64)
    return msgs, items


def _root_only(p, root, count, n):
    msgs, items = np.zeros(p, np.int64), np.zeros(p, np.int64)
    msgs[root], items[root] = count, n
    return msgs, items


def _non_roots(p, root, n):
    msgs = np.ones(p, np.int64)
    msgs[root] = 0
    return msgs, msgs * n


_TRAFFIC = {
    ("bcast", "linear"): lambda p, n, root: _root_only(p, root, p - 1, (p - 1) * n),
    ("bcast", "binomial"): _binomial_bcast,
    ("bcast", "scatter_allgather"): _scatter_allgather,
    ("scatter", "linear"):
        lambda p, n, root: _root_only(p, root, p - 1, n - _chunks(n, p)[root]),
    ("gather", "linear"): lambda p, n, root: _non_roots(p, root, n // p),
    ("reduce", "linear"): lambda p, n, root: _non_roots(p, root, n),
    ("reduce", "binomial"): _binomial_reduce,
    ("allreduce", "reduce_bcast"): lambda p, n, root: tuple(
        a + b for a, b in zip(_binomial_reduce(p, n, 0), _binomial_bcast(p, n, 0))),
    ("allreduce", "ring"): lambda p, n, root: tuple(
        a + b for a, b in zip(_all_but(n, p, lambda r: r), _all_but(n, p, lambda r: r + 1))),
    ("allreduce", "recursive_doubling"): lambda p, n, root: _fold_counts(
        p, n, n, lambda me, p2, rem: (_fl(p), _fl(p) * n)),
    ("allreduce", "rabenseifner"): lambda p, n, root: _rabenseifner_counts(p, n),
    ("reduce_scatter", "linear"): lambda p, n, root: _all_but(n, p, lambda r: r),
    ("reduce_scatter", "ring"): lambda p, n, root: _all_but(n, p, lambda r: r),
    ("allgather", "linear"): lambda p, n, root: _all_but(n, p, lambda r: r),
    ("allgather", "ring"): lambda p, n, root: _all_but(n, p, lambda r: r),
    ("allgather", "recursive_doubling"): lambda p, n, root: _rd_allgather_counts(p, n),
    ("alltoall", "linear"): lambda p, n, root: _all_but(n, p, lambda r: r),
    ("alltoall", "pairwise"): lambda p, n, root: _all_but(n, p, lambda r: r),
}


TRAFFIC_MAX_P = 4096
"""The most ranks :func:`traffic` counts (about a second for Rabenseifner's counts)."""


def traffic(collective: str, algorithm: str, p: int, nbytes: int, *, root: int = 0,
            itemsize: int = 1) -> Traffic:
    """Messages and bytes each rank sends in our implementation (``check=False``).

    ``itemsize`` is the size of the unit that chunking never splits: an element for
    bcast/reduce/allreduce, a row (first axis) for scatter, reduce_scatter and alltoall,
    one rank's share (n/p) for gather and allgather, where ``nbytes`` must divide by p.
    Chunks follow ``np.array_split``: the first (items % p) chunks get one more item.
    Where p is not a power of two, recursive doubling and Rabenseifner count the fold:
    ranks 2i < 2*rem send one message of their data and nothing else; ranks 2i+1 add one
    message of the whole result to the log2(p') rounds of the rest.
    """
    _check(collective, algorithm, p, nbytes)
    checks.integer(p, "p", at_most=TRAFFIC_MAX_P, hint=" (counting every rank's messages is "
                   "O(p^2) for some algorithms; predict() has the closed forms for any p)")
    checks.integer(nbytes, "nbytes", at_least=0)
    checks.integer(itemsize, "itemsize", at_least=1)
    checks.integer(root, "root", at_least=0, at_most=p - 1)
    if nbytes % itemsize:
        raise ValueError(f"nbytes={nbytes} is not a multiple of itemsize={itemsize}")
    n = nbytes // itemsize
    if collective in ("gather", "allgather") and n % p:
        raise ValueError(f"{collective}: nbytes={nbytes} (the gathered total) must split "
                         f"into p={p} equal shares of whole items")
    msgs, items = _TRAFFIC[collective, algorithm](int(p), n, root)
    return Traffic(np.asarray(msgs, np.int64), np.asarray(items, np.int64) * itemsize)


def measured_traffic(traces, tags=None) -> Traffic:
    """Messages and bytes each rank sent, from per-rank traces (lists of ``Message``).

    ``tags``: count only messages with these tags (e.g. to leave out other traffic).
    """
    keep = (lambda m: True) if tags is None else (lambda m: m.tag in set(tags))
    sent = [[m for m in trace if m.op == "send" and keep(m)] for trace in traces]
    return Traffic(np.array([len(s) for s in sent], np.int64),
                   np.array([sum(m.nbytes for m in s) for s in sent], np.int64))


# ---- fitting and bus bandwidth ------------------------------------------------------------

@dataclass(frozen=True)
class LinkFit:
    """t = alpha + beta * n fitted by least squares; ``bandwidth`` = 1/beta in B/s."""

    alpha: float
    beta: float

    @property
    def bandwidth(self) -> float:
        return 1.0 / self.beta if self.beta > 0 else float("inf")

    def __call__(self, nbytes):
        return self.alpha + self.beta * np.asarray(nbytes, dtype=float)


def check_link(link) -> tuple[float, float]:
    """``(link.alpha, link.beta)``: finite numbers, or a TypeError / ValueError saying what
    a link is."""
    if not (hasattr(link, "alpha") and hasattr(link, "beta")):
        raise TypeError(f"link must have .alpha (s) and .beta (s/B): a measure.link(...) result "
                        f"or costmodel.LinkFit(alpha, beta); got {type(link).__name__} "
                        f"{link!r:.60}")
    return checks.real(link.alpha, "link.alpha"), checks.real(link.beta, "link.beta")


def fit(sizes, times) -> LinkFit:
    """Least-squares alpha (s) and beta (s/B) of ``times ~ alpha + beta * sizes``.

    Weights every point by 1/t, i.e. fits relative errors, so that small messages (where
    alpha shows) count as much as large ones (where beta shows).
    """
    n = checks.real_array(sizes, "sizes", at_least=0).ravel()
    t = checks.real_array(times, "times", above=0).ravel()
    if n.shape != t.shape:
        raise ValueError(f"sizes and times need the same length, got {n.size} and {t.size}")
    if len(np.unique(n)) < 2:
        raise ValueError("fit needs at least two different message sizes")
    design = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return LinkFit(float(alpha), float(beta))


BUSBW_FACTOR = {
    "allreduce": lambda p: 2 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "allgather": lambda p: (p - 1) / p,
    "alltoall": lambda p: (p - 1) / p,
    "scatter": lambda p: (p - 1) / p,
    "gather": lambda p: (p - 1) / p,
    "bcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}
"""nccl-tests' factors (doc/PERFORMANCE.md): busbw = algbw * factor(p), so that busbw of a
bandwidth-optimal algorithm equals the link bandwidth whatever p."""


def algbw(nbytes, seconds):
    """Algorithm bandwidth in B/s: n / t (n as in :func:`predict`)."""
    return np.asarray(nbytes, dtype=float) / np.asarray(seconds, dtype=float)


def busbw(collective: str, p: int, nbytes, seconds):
    """Bus bandwidth in B/s (nccl-tests): algbw times the collective's factor."""
    if collective not in BUSBW_FACTOR:
        raise ValueError(f"unknown collective {collective!r}; allowed: {sorted(BUSBW_FACTOR)}")
    checks.integer(p, "p", at_least=1, hint=" (the number of ranks)")
    return algbw(nbytes, seconds) * BUSBW_FACTOR[collective](p)
