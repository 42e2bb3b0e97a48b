"""Chapter 3's experiments as pure functions: settings in, arrays out.

Each takes a runner (:mod:`coursekit.cluster.runner`: ThreadComm ranks or engines), the config,
the data, its own sweep, and ``eval_data=``; each run is :func:`~.data_parallel.train` on
that runner, so the notebook, the widget panel, the benchmark and the tests share them.

* :func:`sweep_exchange` - parameter server vs allreduce as workers grow: time per step,
  exposed communication and bytes through the busiest rank, measured and predicted.
* :func:`lr_rule_grid` - the batch grows with the workers (n per worker fixed): final test
  accuracy for every learning-rate rule.
* :func:`straggler_sweep` - one worker slower by a factor: everybody's step time.
* :func:`averaging_sweep` - local SGD: parameters averaged every k steps against gradient
  allreduce; final accuracy, parameters and bytes each rank sends per step, measured and
  predicted (the allreduce's bytes / k).
* :func:`weak_scaling` - weak scaling (n per worker fixed) on 1, 2, 4 workers: step time split
  into compute, staging (host <-> GPU copies, 0 on the CPU) and communication, efficiency
  T_1 / T_N, against the cost model's T_N ~ t_compute + t_stage + t_comm(N).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from coursekit import checks
from coursekit.datafile import as_source
from coursekit.nn.layout import n_params

from .strategies import predict_bytes_sent, predict_bytes_through, predict_comm

__all__ = ["AveragingSweep", "ExchangeSweep", "LRGrid", "Scaling", "StragglerSweep",
           "averaging_sweep", "lr_rule_grid", "weak_scaling", "straggler_sweep",
           "sweep_exchange"]


def _trainer(runner, data, eval_data):
    """``run(config, n)``: :func:`~.data_parallel.train` on the first n ranks of ``runner``."""
    from .sync_sgd import train
    return lambda config, n: train(runner, config, data, eval_data, workers=n)


def _gradient_bytes(config) -> int:
    return n_params(config.sizes) * np.dtype(config.dtype).itemsize


@dataclass(frozen=True)
class ExchangeSweep:
    """Per exchange mode (dict key), one value per number of workers."""

    workers: np.ndarray
    time_per_step: dict
    comm_per_step: dict
    busiest_bytes: dict
    predicted_comm: dict
    predicted_busiest_bytes: dict


def sweep_exchange(runner, config, data, workers, alpha: float, beta: float, gamma: float = 0.0,
                   modes=("allreduce", "ps"), *, eval_data=None) -> ExchangeSweep:
    """Run ``config`` with every exchange in ``modes`` on each number of ``workers``."""
    run = _trainer(runner, data, eval_data)
    workers = np.asarray(workers, int)
    nbytes, item = _gradient_bytes(config), np.dtype(config.dtype).itemsize
    out = {k: {m: [] for m in modes} for k in ("t", "c", "b", "pc", "pb")}
    for n in workers:
        for mode in modes:
            res = run(replace(config, exchange=mode, bucket_bytes=None), int(n))
            out["t"][mode].append(res.time_per_step)
            out["c"][mode].append(res.comm_per_step)
            out["b"][mode].append(res.bytes_through().max())
            out["pc"][mode].append(predict_comm(mode, config.algorithm, int(n), nbytes, alpha,
                                                beta, gamma, config.average_every))
            out["pb"][mode].append(predict_bytes_through(mode, config.algorithm, int(n), nbytes,
                                                         item, config.average_every).max())
    arr = {k: {m: np.array(v) for m, v in d.items()} for k, d in out.items()}
    return ExchangeSweep(workers, arr["t"], arr["c"], arr["b"], arr["pc"], arr["pb"])


@dataclass(frozen=True)
class LRGrid:
    """``accuracy[i, j]``: final test accuracy with rule ``rules[i]`` on ``workers[j]``."""

    rules: tuple
    workers: np.ndarray
    per_worker_batch: int
    accuracy: np.ndarray
    final_loss: np.ndarray


def lr_rule_grid(runner, config, data, workers, rules, per_worker_batch: int, *,
                 eval_data=None) -> LRGrid:
    """Global batch B = n * N grows with N; ``config.lr`` is tuned for one worker's n."""
    run = _trainer(runner, data, eval_data)
    workers = np.asarray(workers, int)
    acc = np.empty((len(rules), len(workers)))
    loss = np.empty_like(acc)
    for i, rule in enumerate(rules):
        for j, n in enumerate(workers):
            res = run(replace(config, lr_rule=rule, batch_size=per_worker_batch * int(n)), int(n))
            acc[i, j] = res.test_accuracy[-1] if len(res.test_accuracy) else np.nan
            loss[i, j] = np.mean(res.loss[-5:])
    return LRGrid(tuple(rules), workers, per_worker_batch, acc, loss)


@dataclass(frozen=True)
class StragglerSweep:
    """Step time and the straggler's / the others' compute, one value per slow factor."""

    factors: np.ndarray
    time_per_step: np.ndarray
    straggler_compute: np.ndarray
    others_compute: np.ndarray


def straggler_sweep(runner, config, data, n: int, factors, rank: int = 0, *,
                    eval_data=None) -> StragglerSweep:
    """Make worker ``rank`` of ``n`` slower by each factor in turn."""
    run = _trainer(runner, data, eval_data)
    factors = np.asarray(factors, float)
    rows = []
    for f in factors:
        res = run(replace(config, straggler_rank=rank, slow_factor=float(f)), n)
        others = np.delete(res.compute_s, rank, axis=0) if n > 1 else res.compute_s
        rows.append((res.time_per_step, np.median(res.compute_s[rank]), np.median(others)))
    t, s, o = np.array(rows).T
    return StragglerSweep(factors, t, s, o)


@dataclass(frozen=True)
class Scaling:
    """Weak scaling: one entry per number of workers (seconds per step); ``stage``: the
    host <-> device copies (0 on the CPU)."""

    workers: np.ndarray
    step: np.ndarray
    compute: np.ndarray
    stage: np.ndarray
    comm: np.ndarray
    predicted_comm: np.ndarray

    @property
    def predicted_step(self) -> np.ndarray:
        """The model: T_N = t_compute + t_stage + t_comm(N), with the one-worker compute and
        staging (both independent of N in weak scaling) and the predicted communication."""
        return self.compute[0] + self.stage[0] + self.predicted_comm

    @property
    def efficiency(self) -> np.ndarray:
        """T_1 / T_N: 1 is perfect weak scaling (N times the examples in the same time)."""
        return self.step[0] / self.step

    @property
    def predicted_efficiency(self) -> np.ndarray:
        return self.predicted_step[0] / self.predicted_step


def weak_scaling(runner, config, data, workers, alpha: float, beta: float, gamma: float = 0.0,
            per_worker_batch: int | None = None, *, eval_data=None) -> Scaling:
    """Run with n examples per worker on each number of workers (weak scaling)."""
    run = _trainer(runner, data, eval_data)
    workers = np.asarray(workers, int)
    n_each = per_worker_batch or config.batch_size
    nbytes = _gradient_bytes(config)
    rows = []
    for n in workers:
        res = run(replace(config, batch_size=n_each * int(n)), int(n))
        rows.append((res.time_per_step, res.compute_per_step, res.stage_per_step,
                     res.comm_per_step,
                     predict_comm(config.exchange, config.algorithm, int(n), nbytes, alpha, beta,
                                  gamma, config.average_every, config.bucket_bytes)))
    step, compute, stage, comm, pred = np.array(rows).T
    return Scaling(workers, step, compute, stage, comm, pred)


@dataclass(frozen=True)
class AveragingSweep:
    """Local SGD against gradient allreduce, one entry per averaging interval ``every`` (k).

    ``allreduce``: the gradient-allreduce run (the reference); ``runs``: the
    ``exchange="average"`` run for each k. ``bytes_sent`` (k, N): bytes each rank sent per
    step, from the traces of the last lcm(k) steps; ``predicted_bytes_sent`` the same from
    :func:`~.strategies.predict_bytes_sent` (the allreduce's bytes / k).
    """

    workers: int
    every: np.ndarray
    allreduce: object
    runs: tuple
    bytes_sent: np.ndarray
    predicted_bytes_sent: np.ndarray

    @property
    def accuracy(self) -> np.ndarray:
        """Final test accuracy of each k's run (NaN without eval_data)."""
        return np.array([r.test_accuracy[-1] if len(r.test_accuracy) else np.nan
                         for r in self.runs])

    @property
    def final_loss(self) -> np.ndarray:
        """Mean global batch loss of each k's last 5 steps."""
        return np.array([np.mean(r.loss[-5:]) for r in self.runs])


def averaging_sweep(runner, config, data, every, *, workers: int | None = None,
                    eval_data=None) -> AveragingSweep:
    """Train ``config`` with gradient allreduce, then with ``exchange="average"`` and
    ``average_every=k`` for each k in ``every``, on ``workers`` ranks (default: all).

    Local SGD: each worker steps on its own gradient and every k steps the parameters are
    averaged with one allreduce, so a rank sends the allreduce's bytes once per k steps:
    bytes per step = allreduce bytes / k. The traces cover the last lcm(every) steps, so the
    run's step count must be a multiple of it (ValueError otherwise).
    """
    every = np.asarray([checks.integer(k, "every", at_least=1) for k in every], int)
    if every.size == 0:
        raise ValueError("every: give at least one averaging interval k >= 1")
    n = config.check_workers(runner.size if workers is None else workers)
    window = math.lcm(*every.tolist())
    total = config.total_steps(len(as_source(data)))
    if total % window:
        raise ValueError(f"the run has {total} steps, not a multiple of lcm(every) = {window}: "
                         f"set max_steps to a multiple of {window}, so that the traced steps "
                         "hold whole averaging periods of every k")
    base = replace(config, timeline_steps=window, bucket_bytes=None)
    run = _trainer(runner, data, eval_data)
    reference = run(replace(base, exchange="allreduce", average_every=1), n)
    runs = tuple(run(replace(base, exchange="average", average_every=int(k)), n) for k in every)
    nbytes, item = _gradient_bytes(config), np.dtype(config.dtype).itemsize
    predicted = np.array([predict_bytes_sent("average", config.algorithm, n, nbytes, item, int(k))
                          * np.ones(n) for k in every])
    return AveragingSweep(n, every, reference, runs, np.array([r.bytes_sent() for r in runs]),
                          predicted)
