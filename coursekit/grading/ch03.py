"""Checks for chapter 3's exercises: the data-parallel step (exercise 03) and local SGD
(exercise 03_local_sgd).

**The data-parallel step** (:func:`check_data_parallel_step`): one step of synchronous
data-parallel SGD with allreduce.

The student's ``dp_step(comm, mlp, X, y, batch_size, lr) -> loss`` gets this rank's rows
(X, y) of a global batch of ``batch_size`` rows; it must leave in ``mlp.params`` exactly
what serial SGD on the whole batch would: w <- w - lr * g with
g = sum_k (n_k / B) g_k (each rank's mean gradient weighted by its share of the batch).

The check runs it on ThreadComm ranks (p = 1..4, batches that split evenly and unevenly,
three steps, float64) against the serial step computed here with ``mlp.loss_and_grad``
on the concatenated batch, and tells the usual mistakes apart (summing without
weighting, weighting by 1/p instead of n_k / B, forgetting to communicate).

**Local SGD** (:func:`check_local_sgd`): the student's
``local_sgd(comm, mlp, batches, batch_size, lr, k)`` trains on this rank's ``batches``
(one ``(X, y)`` per step, its rows of a global batch of ``batch_size`` rows): each step
w_k <- w_k - lr g_k on its own gradient, and after every k-th step and after the last one
the periodic average w <- sum_k s_k w_k, one allreduce of the weighted parameters, with
s_k = (rows rank k trained on since the last average) / (rows all ranks trained on),
the mean of its n_k / B over those steps. The reference (:func:`local_sgd_reference`)
runs the p workers one after the other in this process; the tests check that it is the
library's ``exchange="average"`` (:mod:`coursekit.parallel.data_parallel.strategies`),
and that with k = 1 it is serial SGD on the whole batch.
"""

from __future__ import annotations

import numpy as np

from coursekit.comm import run_local
from coursekit.comm.trace import recording
from coursekit.grading.core import CheckFailure, check
from coursekit.nn import MLP

SIZES = (6, 5, 3)
CASES = ((1, 7), (2, 8), (3, 10), (4, 12), (4, 9))  # (ranks, global batch)
STEPS = 3
TIMEOUT = 5.0


def _data(seed, rows):
    rng = np.random.default_rng([seed, rows])
    return rng.standard_normal((rows, SIZES[0])), rng.integers(0, SIZES[-1], rows)


def _serial(X, y, lr, p, combine=None):
    """Parameters after STEPS steps of serial SGD on the whole batch (``combine`` None), or
    with the gradient combine([(n_k, g_k) per shard], B) of a typical mistake."""
    mlp = MLP(SIZES, dtype=np.float64, seed=0)
    for step in range(STEPS):
        if combine is None:
            grad = mlp.loss_and_grad(X[step], y[step])[1]
        else:
            grad = combine([(len(Xk), mlp.loss_and_grad(Xk, yk)[1].copy()) for Xk, yk in
                            zip(np.array_split(X[step], p), np.array_split(y[step], p))],
                           len(X[step]))
        mlp.params[...] -= lr * grad
    return mlp.params.copy()


MISTAKES = {
    "summed the gradients without dividing by anything (weight each rank's mean gradient "
    "by n_k / B, its share of the batch)": lambda parts, B: sum(g for _, g in parts),
    "averaged with 1/p; with uneven shards each rank's mean gradient must be weighted by "
    "n_k / B (its rows over the global batch)": lambda parts, B: sum(g for _, g in parts) / len(parts),
    "did not combine the ranks' gradients (each rank stepped on its own gradient)":
        lambda parts, B: parts[0][1],
}


@check("data_parallel_step")
def check_data_parallel_step(dp_step, seed: int = 0):
    """``dp_step(comm, mlp, X, y, batch_size, lr) -> loss``, updating ``mlp.params`` in place."""
    lr = 0.3
    for p, batch in CASES:
        X, y = zip(*(_data(seed + s, batch) for s in range(STEPS)))
        case = f"on p={p} ranks with a global batch of {batch} rows"

        def body(comm):
            mlp = MLP(SIZES, dtype=np.float64, seed=0)
            losses = []
            with recording(comm) as messages:
                for step in range(STEPS):
                    Xk = np.array_split(X[step], p)[comm.rank]
                    yk = np.array_split(y[step], p)[comm.rank]
                    losses.append(dp_step(comm, mlp, Xk, yk, batch, lr))
                return mlp.params.copy(), losses, len(messages())

        out = run_local(body, p, timeout=TIMEOUT)
        want = _serial(X, y, lr, p)
        for rank, (params, losses, messages) in enumerate(out):
            if p > 1 and messages == 0:
                raise CheckFailure(f"{case}: rank {rank} sent and received no message; "
                                   "the gradients must be combined with an allreduce")
            if not np.array_equal(params, out[0][0]):
                raise CheckFailure(f"{case}: rank {rank} ended with parameters different from "
                                   "rank 0's; every rank must apply the same update")
            if not all(np.isscalar(v) and np.isfinite(v) for v in losses):
                raise CheckFailure(f"{case}: rank {rank} returned {losses!r}; return the local "
                                   "mean loss (a float) of each step")
        got = out[0][0]
        if not np.allclose(got, want, rtol=1e-10, atol=1e-12):
            for mistake, combine in MISTAKES.items():
                if np.allclose(got, _serial(X, y, lr, p, combine), rtol=1e-10, atol=1e-12):
                    raise CheckFailure(f"{case}: you {mistake}")
            err = np.abs(got - want).max()
            raise CheckFailure(f"{case}: after {STEPS} steps the parameters differ from serial "
                               f"SGD on the whole batch by up to {err:.3g}")
    return "same parameters as serial SGD on the whole batch, p = 1..4, even and uneven shards"


LOCAL_CASES = ((1, 8, 2, 5), (2, 8, 1, 4), (3, 10, 2, 5), (4, 12, 3, 7), (4, 9, 4, 6))
"""(ranks p, global batch B, averaging interval k, steps): even and uneven shards, and
step counts that k does not divide (the last average comes after a shorter period)."""


def local_sgd_reference(batches, batch_size, lr, k, *, final=True, share=None, every=None):
    """Local SGD of ``len(batches)`` workers, serially: ``batches[r]`` is worker r's list of
    (X, y) per step. Returns the parameters every worker ends with. The keywords give the
    usual mistakes: ``final=False`` skips the average after the last step, ``share(n_rows,
    p, B, steps)`` replaces the weight rows / (steps * B), ``every`` replaces k."""
    p, steps = len(batches), len(batches[0])
    every = k if every is None else every
    models = [MLP(SIZES, dtype=np.float64, seed=0) for _ in range(p)]
    rows, since = np.zeros(p), 0
    for step in range(steps):
        for r, mlp in enumerate(models):
            X, y = batches[r][step]
            mlp.params[...] -= lr * mlp.loss_and_grad(X, y)[1]
            rows[r] += len(X)
        since += 1
        if (step + 1) % every == 0 or (final and step == steps - 1):
            weights = rows / (since * batch_size) if share is None else \
                [share(n, p, batch_size, since) for n in rows]
            average = sum(w * mlp.params for w, mlp in zip(weights, models))
            for mlp in models:
                mlp.params[...] = average
            rows[...], since = 0, 0
    return models[0].params.copy()


LOCAL_MISTAKES = {
    "did not average after the last step; when k does not divide the number of steps the "
    "last period is shorter, and the ranks must still end with one model":
        dict(final=False),
    "weighted each rank by 1/p; with uneven shards weight it by its share of the rows since "
    "the last average (rows seen / (steps * batch_size))":
        dict(share=lambda n, p, B, steps: 1 / p),
    "summed the parameters without weights (weight each rank by its share of the rows)":
        dict(share=lambda n, p, B, steps: 1.0),
    "averaged after every step; average only after every k-th step (and after the last)":
        dict(every=1),
}


@check("local_sgd")
def check_local_sgd(local_sgd, seed: int = 0):
    """``local_sgd(comm, mlp, batches, batch_size, lr, k)``, updating ``mlp.params`` in place."""
    lr = 0.3
    for p, batch, k, steps in LOCAL_CASES:
        X, y = zip(*(_data(seed + s, batch) for s in range(steps)))
        batches = [[(np.array_split(X[s], p)[r], np.array_split(y[s], p)[r])
                    for s in range(steps)] for r in range(p)]
        case = f"on p={p} ranks, global batch {batch}, k={k}, {steps} steps"

        def body(comm):
            mlp = MLP(SIZES, dtype=np.float64, seed=0)
            with recording(comm) as messages:
                local_sgd(comm, mlp, batches[comm.rank], batch, lr, k)
                return mlp.params.copy(), len(messages())

        out = run_local(body, p, timeout=TIMEOUT)
        for rank, (params, messages) in enumerate(out):
            if p > 1 and messages == 0:
                raise CheckFailure(f"{case}: rank {rank} sent and received no message; the "
                                   "parameters must be averaged with an allreduce")
        got = out[0][0]
        for rank, (params, _) in enumerate(out[1:], start=1):
            if not np.allclose(params, got, rtol=1e-10, atol=1e-12):
                if np.allclose(got, local_sgd_reference(batches, batch, lr, k, final=False),
                               rtol=1e-10, atol=1e-12):
                    raise CheckFailure(f"{case}: you {next(iter(LOCAL_MISTAKES))}")
                raise CheckFailure(f"{case}: rank {rank} ended with parameters different from "
                                   "rank 0's; after the last step every rank must hold the average")
        want = local_sgd_reference(batches, batch, lr, k)
        if not np.allclose(got, want, rtol=1e-10, atol=1e-12):
            for mistake, kwargs in LOCAL_MISTAKES.items():
                if np.allclose(got, local_sgd_reference(batches, batch, lr, k, **kwargs),
                               rtol=1e-10, atol=1e-12):
                    raise CheckFailure(f"{case}: you {mistake}")
            err = np.abs(got - want).max()
            raise CheckFailure(f"{case}: the parameters differ from local SGD's (a step on each "
                               f"rank's own gradient, a weighted average every {k} steps and "
                               f"after the last) by up to {err:.3g}")
    return "same parameters as local SGD averaged every k steps, p = 1..4, even and uneven shards"
