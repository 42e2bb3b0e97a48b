"""Checks for exercise 08: ZeRO-2's gradient step.

The student writes ``zero2_step(comm, grad, shard, optimizer, layout) -> params``: this
rank's gradient of its part of the global batch (the full flat length) goes in; the rank
must sum it over all ranks but keep only its own shard (reduce-scatter), update its shard
of the weights with ``optimizer`` (built on ``shard``), and return the whole flat weights
(all-gather of the updated shards). The check

1. trains the chapter-1 MLP (float64, momentum) on 3 ThreadComm ranks with the student's
   step and compares the weights after every step with serial training on the same
   global batches (relative 1e-12);
2. counts the bytes the step sent (the trace, fingerprints of ``check=True`` excluded):
   they must be the reduce-scatter's plus the all-gather's, 2 (N-1) P_pad values, the
   volume of one allreduce; an allreduce of the gradient followed by an all-gather sends
   1.5 x that and fails.
"""

from __future__ import annotations

import numpy as np

from coursekit.grading.core import CheckFailure, check

N_RANKS, STEPS, BATCH, LR, MOMENTUM = 3, 4, 48, 0.1, 0.9
SIZES = (64, 23, 17, 10)


def _batches(n_rows: int):
    order = np.random.default_rng(0).permutation(n_rows)
    return [order[t * BATCH:(t + 1) * BATCH] for t in range(STEPS)]


def _serial(X, y):
    from coursekit.nn import MLP
    from coursekit.nn.optim import make_optimizer
    mlp = MLP(SIZES, dtype=np.float64, seed=1)
    opt = make_optimizer(mlp.params, LR, MOMENTUM)
    history = []
    for rows in _batches(len(X)):
        _, grad = mlp.loss_and_grad(X[rows], y[rows])
        opt.step(grad)
        history.append(mlp.params.copy())
    return history


def _rank(comm, step_fn, X, y):
    from coursekit.collectives.tags import FINGERPRINT_TAG
    from coursekit.comm.trace import recording
    from coursekit.nn import MLP
    from coursekit.nn.optim import make_optimizer
    from coursekit.parallel.zero import ShardLayout
    mlp = MLP(SIZES, dtype=np.float64, seed=1)
    layout = ShardLayout.of(mlp, comm.size)
    shard = layout.rows(mlp.params)[comm.rank].copy()
    optimizer = make_optimizer(shard, LR, MOMENTUM)
    history, sent = [], []
    for rows in _batches(len(X)):
        mine = np.array_split(rows, comm.size)[comm.rank]
        _, grad = mlp.loss_and_grad(X[mine], y[mine])
        grad *= len(mine) / BATCH  # this rank's share of the global batch's mean gradient
        with recording(comm) as messages:
            params = step_fn(comm, grad, shard, optimizer, layout)
            sent.append(sum(m.nbytes for m in messages()
                            if m.op == "send" and m.tag != FINGERPRINT_TAG))
        if not isinstance(params, np.ndarray) or params.shape != mlp.params.shape:
            raise CheckFailure(f"zero2_step must return the whole flat weights, an array of "
                               f"shape {mlp.params.shape}; got {getattr(params, 'shape', params)!r}")
        mlp.params[...] = params
        history.append(params.copy())
    return history, sent


@check("zero2_step")
def check_zero2_step(step_fn):
    """ZeRO-2's step equals serial training and sends one allreduce's volume."""
    from coursekit.comm import run_local
    from coursekit.data import load_digits
    from coursekit.nn import MLP
    from coursekit.parallel.zero import ShardLayout, sent_bytes
    digits = load_digits(dtype=np.float64)
    X, y = digits.X_train[:BATCH * STEPS], digits.y_train[:BATCH * STEPS]
    want = _serial(X, y)
    results = run_local(_rank, N_RANKS, step_fn, X, y, timeout=20)
    for rank, (history, _) in enumerate(results):
        for t, (got, expected) in enumerate(zip(history, want)):
            if not np.allclose(got, expected, rtol=1e-12, atol=1e-14):
                worst = np.abs(got - expected).max()
                raise CheckFailure(
                    f"after step {t + 1} rank {rank}'s weights differ from serial training by up "
                    f"to {worst:.3g}: sum the gradients over all ranks (reduce-scatter with "
                    "op='sum'), update only your shard, and all-gather the updated shards")
    mlp = MLP(SIZES, dtype=np.float64)
    layout = ShardLayout.of(mlp, N_RANKS)
    allowed = sent_bytes(2, mlp.n_params, layout, 8)
    for t in range(STEPS):
        sent = sum(sends[t] for _, sends in results)
        if sent != allowed:
            raise CheckFailure(
                f"step {t + 1} sent {sent} bytes from all {N_RANKS} ranks; ZeRO-2 sends "
                f"{allowed}: a reduce-scatter and an all-gather of the {N_RANKS} x "
                f"{layout.width} shard values, 2 (N-1) N C x 8 bytes, the volume of one "
                "allreduce (an allreduce of the gradient, then an all-gather, sends 1.5 x that)")
    return (f"{STEPS} steps on {N_RANKS} ranks equal serial training; {allowed} bytes per step, "
            "one allreduce's volume")
