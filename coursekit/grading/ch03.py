"""Checks for exercise 03: one step of synchronous data-parallel SGD with allreduce.

The student's ``dp_step(comm, mlp, X, y, batch_size, lr) -> loss`` gets this rank's rows
(X, y) of a global batch of ``batch_size`` rows; it must leave in ``mlp.params`` exactly
what serial SGD on the whole batch would: w <- w - lr * g with
g = sum_k (n_k / B) g_k (each rank's mean gradient weighted by its share of the batch).

The check runs it on ThreadComm ranks (p = 1..4, batches that split evenly and unevenly,
three steps, float64) against the serial step computed here with ``mlp.loss_and_grad``
on the concatenated batch, and tells the usual mistakes apart (summing without
weighting, weighting by 1/p instead of n_k / B, forgetting to communicate).
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
