"""Schedule generators: GPipe, 1F1B, interleaved 1F1B and ZB-H1, as per-rank action lists.

p = ``stages`` ranks, m = ``microbatches``, v = ``chunks``. GPipe and the 1F1B family run
each backward as one B (full backward); ZB-H1 splits it into I (input gradient) and W
(weight gradient). With times T_F, T_I, T_W per micro-batch (T_B = T_I + T_W) and no
communication cost the idle ("bubble") time of every rank is

* GPipe (all F, then all B):      (p - 1)(T_F + T_B),      peak activations m;
* 1F1B (PipeDream-Flush):         (p - 1)(T_F + T_B),      peak activations p - r <= p;
* interleaved 1F1B (v chunks):    (p - 1)(T_F + T_B) / v,  more activations than 1F1B;
* ZB-H1 (F, I, W; T_W <= T_F):    (p - 1)(T_F + T_I - T_W), peak as 1F1B.
"""

from __future__ import annotations

from coursekit import checks

from .actions import B, F, I, W
from .schedule_type import Schedule

NAMES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1")
MAX_WORK = 1 << 14
"""The most stages x microbatches x chunks a schedule may have (every one is an action to
build, validate and play in Python; this many take about half a second)."""


def gpipe(p: int, m: int) -> list[list]:
    """Every rank: F of all m micro-batches, then B of all of them (in reverse order)."""
    return [[F(r, i) for i in range(m)] + [B(r, i) for i in reversed(range(m))] for r in range(p)]


def one_f_one_b(p: int, m: int) -> list[list]:
    """Rank r: p-1-r warm-up forwards, then alternate one F and one B, then the last Bs."""
    out = []
    for r in range(p):
        warm = min(p - 1 - r, m)
        acts = [F(r, i) for i in range(warm)]
        for i in range(m - warm):
            acts += [F(r, warm + i), B(r, i)]
        acts += [B(r, i) for i in range(m - warm, m)]
        out.append(acts)
    return out


def zb_h1(p: int, m: int) -> list[list]:
    """ZB-H1: 1F1B with the backward split into I (input gradient, on the critical path)
    and W (weight gradient, which can wait). Rank r: p-1-r warm-up F; r steps of F, I
    whose W is deferred; then F, I, W; then I, W; then the r deferred W fill the tail."""
    out = []
    for r in range(p):
        warm = min(p - 1 - r, m)
        acts, f, b, w = [F(r, i) for i in range(warm)], warm, 0, 0
        while f < m:
            acts += [F(r, f), I(r, b)]
            f, b = f + 1, b + 1
            if b > r:  # the first r weight gradients wait for the tail
                acts.append(W(r, w))
                w += 1
        while b < m:
            acts += [I(r, b), W(r, w)]
            b, w = b + 1, w + 1
        out.append(acts + [W(r, i) for i in range(w, m)])
    return out


def interleaved_1f1b(p: int, m: int, v: int) -> list[list]:
    """Megatron's interleaved 1F1B: rank r holds stages r, r+p, ..., r+(v-1)p.

    Micro-batches go in groups of p: the k-th forward of a rank is chunk (k // p) % v of
    micro-batch (k // (p v)) p + k % p; backwards visit the chunks in reverse. Warm-up:
    2(p-1-r) + (v-1)p forwards, then one F / one B, then the remaining Bs. With v = 1
    it is exactly 1F1B.
    """
    total = m * v

    def mb(k):
        return (k // (p * v)) * p + k % p

    out = []
    for r in range(p):
        fwd = [F(((k // p) % v) * p + r, mb(k)) for k in range(total)]
        bwd = [B((v - 1 - (k // p) % v) * p + r, mb(k)) for k in range(total)]
        # Megatron's warm-up; with v = 1 it is 1F1B's p-1-r (the extra p-1-r only pays off with chunks)
        warm = min((p - 1 - r) * (2 if v > 1 else 1) + (v - 1) * p, total)
        acts = fwd[:warm]
        for j in range(total - warm):
            acts += [fwd[warm + j], bwd[j]]
        out.append(acts + bwd[total - warm:])
    return out


def schedule(name: str, stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """The named schedule for ``stages`` ranks and ``microbatches`` micro-batches, validated.

    ``chunks`` (v) > 1 only for "interleaved_1f1b". Allowed: stages >= 1; microbatches >= 1
    for "gpipe", >= stages for "1f1b" and "zb_h1" (fewer leave no steady 1F1B phase: use
    GPipe), a multiple of stages for "interleaved_1f1b" (micro-batches go in groups of p);
    stages x microbatches x chunks <= :data:`MAX_WORK`.
    """
    from .validate import validate

    if name not in NAMES:
        raise ValueError(f"unknown schedule {name!r}; allowed: {', '.join(NAMES)}")
    p, m, v = (checks.integer(value, arg, at_least=1) for arg, value in
               (("stages", stages), ("microbatches", microbatches), ("chunks", chunks)))
    if p * m * v > MAX_WORK:
        raise ValueError(f"stages x microbatches x chunks = {p} x {m} x {v} is too large to "
                         f"simulate action by action: allowed at most {MAX_WORK}")
    if name != "interleaved_1f1b" and v != 1:
        raise ValueError(f"chunks={v}: only 'interleaved_1f1b' puts several model chunks on a "
                         f"rank; use chunks=1 for {name!r}")
    if name in ("1f1b", "zb_h1") and m < p:
        raise ValueError(f"{name!r} needs microbatches >= stages ({m} < {p}): with fewer there is "
                         "no steady one-forward-one-backward phase; use 'gpipe' or more micro-batches")
    if name == "interleaved_1f1b" and m % p:
        raise ValueError(f"'interleaved_1f1b' needs microbatches to be a multiple of stages "
                         f"({m} is not a multiple of {p}): micro-batches enter in groups of p")
    compute = {"gpipe": lambda: gpipe(p, m), "1f1b": lambda: one_f_one_b(p, m),
               "zb_h1": lambda: zb_h1(p, m), "interleaved_1f1b": lambda: interleaved_1f1b(p, m, v)}
    sched = Schedule.from_compute(name, compute[name](), m, v)
    validate(sched)
    return sched
