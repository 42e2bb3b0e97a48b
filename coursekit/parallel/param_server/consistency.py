"""Consistency models of the parameter server: when may a worker go on, when is an update applied.

Every worker has a **clock** ``c``: the number of iterations it has pushed. Every shard has a
**version** ``v``: the number of updates it has applied. A gradient's **staleness** is the
shard's version when the gradient is applied minus the version it was computed on.

* **BSP** (bulk synchronous): every worker waits for every other at every iteration. The
  shard averages the ``W`` gradients of iteration ``c`` and applies one update,
  ``w_{c+1} = w_c - lr * (1/W) sum_i g_i(w_c)``, which is serial SGD on a ``W`` times larger
  batch. Staleness is always 0.
* **SSP** with staleness bound ``s`` (stale synchronous parallel, the lecture's bounded delay
  tau): a worker at clock ``c`` may proceed only if ``c - min_clock <= s``, where
  ``min_clock`` is the smallest clock of the live workers. Iteration ``k``'s gradients are
  averaged into one update, applied once every live worker has pushed iteration ``k``
  (Li et al., OSDI 2014), so ``version == min_clock`` and a worker at clock ``c`` reads
  ``version >= c - s``: every staleness lies in ``0..s``. ``s = 0`` is BSP exactly.
  Reads are **read-my-writes** (Ho et al., NIPS 2013): the weights a worker pulls include
  its own gradients still waiting for the slower workers, each as its ``1/W`` share of
  the update it will join (:meth:`.server.ShardServer.own_view`). Simplified against Ho
  et al., whose server applies each additive update the moment it arrives, so a reader
  may also see *fresher* updates of the others: here the others' updates of an iteration
  appear together once it is complete, so a reader always gets the worst case the bound
  allows for them, and the staleness histograms are an upper bound on what Ho et al.'s
  system would show.
* **ASP** (asynchronous, Downpour SGD): no gate; every pushed gradient is applied the moment
  it arrives, ``w <- w - lr * g`` (version + 1); workers fetch every ``n_fetch`` steps and
  push the sum of their last ``n_push`` gradients. Staleness is unbounded.

A **warm-up** of ``warmup`` iterations runs synchronously (as SSP with ``s = 0``) before SSP or
ASP take over. This is our choice, not DistBelief's: Dean et al. (2012) warm-started
Downpour by training a *single* replica first and only then starting the others (and
credited Adagrad for its stability); they had no synchronous phase across workers. Here
every worker takes part in the warm-up, which on one data set is the same large-batch
SGD as BSP (``warmup == steps`` gives BSP's weights exactly).
"""

from __future__ import annotations

import numpy as np

MODELS = ("bsp", "ssp", "asp")


def ssp_gate(clock: int, clocks: np.ndarray, staleness: int) -> bool:
    """SSP's gate: may a worker at ``clock`` proceed, given the live workers' ``clocks``?

    True iff ``clock - min(clocks) <= staleness``. ``clocks`` includes the asking worker,
    so the slowest worker (``clock == min(clocks)``) is always allowed: no deadlock.
    """
    return clock - int(np.min(clocks)) <= staleness


def pull_bound(model: str, staleness: int, warmup: int, clock: int) -> int | None:
    """The staleness bound a shard enforces on a pull before iteration ``clock`` (None: none).

    Warm-up iterations (``clock < warmup``) are synchronous; ASP's first asynchronous pull
    (``clock == warmup``) also waits until the warm-up's last update is applied.
    """
    if model == "ssp":
        return 0 if clock < warmup else staleness
    if model == "asp":
        return 0 if warmup > 0 and clock <= warmup else None
    raise ValueError(f"model {model!r} has no clock gate; gated models: 'ssp', 'asp' (warm-up)")


def combined_push(model: str, warmup: int, clock: int) -> bool:
    """True when the push that brings a worker to ``clock`` is averaged per iteration
    (SSP and warm-up), False when it is applied on arrival (ASP after the warm-up)."""
    return model == "ssp" or clock <= warmup


def ordered_mean(grads: list[np.ndarray]) -> np.ndarray:
    """The mean of ``grads``, summed in the given (worker) order: the same bits every run."""
    total = grads[0].copy()
    for g in grads[1:]:
        total += g
    total /= total.dtype.type(len(grads))
    return total
