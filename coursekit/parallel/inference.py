"""Batch inference is embarrassingly parallel: every row's prediction is independent.

Rank 0 holds a batch of n rows (n_in float32 features each) and a trained model that every
rank already has. One pass:

1. rank 0 **scatters** the rows: p - 1 messages, n/p rows each (rank 0 keeps its own share);
2. every rank predicts its n/p rows (no communication: 2 (n/p) sum_l n_in n_out FLOPs);
3. rank 0 **gathers** the predicted labels (int64): p - 1 messages back.

Bytes sent by all ranks together, per pass (the payloads; the collectives run with
``check=False``, so no argument fingerprints are exchanged):

    B(p) = (p - 1)/p * n * (4 n_in + 8)

and time t(p) ~ t_scatter + t_compute / p + t_gather: the compute splits p ways, the data
still leaves rank 0 one message after the other (the linear scatter's (p - 1)/p n beta).
On a machine with fewer cores than ranks the compute does not shrink p-fold: ranks share
cores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.cluster.runner import Runner
from coursekit.collectives import gather, scatter
from coursekit.comm.trace import now, recording
from coursekit.nn.mlp import MLP

__all__ = ["BatchInferenceConfig", "BatchInferenceResult", "batch_bytes", "batch_inference"]

LABEL_BYTES = 8  # np.int64, what MLP.predict returns


def batch_bytes(rows: int, n_in: int, p: int) -> int:
    """B(p) = (p - 1)/p * rows * (4 n_in + 8): the rows scattered plus the labels gathered."""
    rows = checks.integer(rows, "rows", at_least=1)
    n_in = checks.integer(n_in, "n_in", at_least=1)
    p = checks.integer(p, "p", at_least=1)
    if rows % p:
        raise ValueError(f"rows={rows} must be divisible by p={p}")
    return (p - 1) * (rows // p) * (4 * n_in + LABEL_BYTES)


@dataclass(frozen=True)
class BatchInferenceConfig:
    """rows: the batch size (the first rows of the data, repeated cyclically as needed;
    divisible by the number of workers); repeats: passes timed (the result keeps the
    fastest, the least disturbed by other load)."""

    rows: int = 36_000
    repeats: int = 5

    def __post_init__(self):
        checks.integer(self.rows, "rows", at_least=1)
        checks.integer(self.repeats, "repeats", at_least=1)


@dataclass(frozen=True)
class BatchInferenceResult:
    """predictions: rank 0's gathered labels (rows,); bytes_sent: all ranks' payload bytes
    in one pass (equal in every pass); seconds: each pass's time on rank 0, scatter to
    gather; compute_seconds: rank 0's predict time in each pass."""

    config: BatchInferenceConfig
    p: int
    predictions: np.ndarray
    bytes_sent: int
    seconds: np.ndarray
    compute_seconds: np.ndarray

    @property
    def best_seconds(self) -> float:
        return float(self.seconds.min())

    @property
    def throughput(self) -> float:
        """Rows per second in the fastest pass."""
        return self.config.rows / self.best_seconds


def _batch(X: np.ndarray, rows: int) -> np.ndarray:
    return np.ascontiguousarray(X[np.arange(rows) % len(X)], dtype=np.float32)


def _worker(comm, mlp: MLP, X, rows: int, repeats: int):
    batch = _batch(X, rows) if comm.rank == 0 else None
    seconds, compute, sent = [], [], []
    for _ in range(repeats):
        comm.barrier()
        with recording(comm) as messages:
            t0 = now()
            mine = scatter(comm, batch, root=0, check=False)
            t1 = now()
            labels = mlp.predict(mine)
            t2 = now()
            everything = gather(comm, labels, root=0, check=False)
            t3 = now()
            sent.append(sum(m.nbytes for m in messages() if m.op == "send"))
        seconds.append(t3 - t0)
        compute.append(t2 - t1)
    return everything, sent, seconds, compute


def batch_inference(runner: Runner, config: BatchInferenceConfig, mlp: MLP, X, *,
                    workers: int | None = None,
                    timeout: float | None = None) -> BatchInferenceResult:
    """Predict ``config.rows`` rows of ``X`` (cycled) with ``mlp`` on the first ``workers``
    ranks of ``runner`` (default all), ``config.repeats`` times; see the module docstring."""
    checks.instance(runner, "runner", Runner, " (LocalRunner(n) or ClusterRunner(cluster))")
    checks.instance(config, "config", BatchInferenceConfig)
    checks.instance(mlp, "mlp", MLP, " (coursekit.nn.MLP)")
    p = runner.check_workers(workers)
    X = np.asarray(X)
    if X.ndim != 2 or len(X) == 0 or X.shape[1] != mlp.sizes[0] or X.dtype.kind not in "iuf":
        raise ValueError(f"X must be a 2-D array of numbers with {mlp.sizes[0]} columns (the "
                         f"model's input width) and at least one row; got {X.dtype} {X.shape}")
    if config.rows % p:
        raise ValueError(f"rows={config.rows} must be divisible by workers={p}")
    X = X[:config.rows]  # rank 0 needs no more rows than the batch
    out = runner.run(_worker, mlp, X, config.rows, config.repeats, ranks=p, timeout=timeout)
    predictions = out[0][0]
    per_pass = np.sum([o[1] for o in out], axis=0)  # all ranks' bytes, pass by pass
    if len(set(per_pass.tolist())) != 1:
        raise RuntimeError(f"the passes sent different byte counts: {per_pass.tolist()}")
    return BatchInferenceResult(config, p, predictions, int(per_pass[0]),
                                np.array(out[0][2]), np.array(out[0][3]))
