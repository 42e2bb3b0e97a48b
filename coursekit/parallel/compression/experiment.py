"""Data-parallel SGD on digits with compressed gradients: the chapter's experiment.

Every rank holds the same MLP, trains on its shard of the digits and, every step,
averages its gradient with the others through :func:`~.communicator.exchange` (compressor
+ error feedback), then takes the same SGD step. Chapter 3's synchronous data-parallel
loop, kept minimal here (no buckets, no overlap, plain SGD), with the gradient exchange
as a hook (``exchanger``) so that an exercise can plug in its own.

:func:`train_worker` runs on one rank, given a Comm (ThreadComm in tests, the engines'
comm on the cluster); :func:`train` runs it on the first p ranks of a runner (ThreadComm
ranks in this process or a cluster's engines, :mod:`coursekit.runner`) and returns a
:class:`CompressionResult`. Workers publish their per-epoch test accuracy with
:mod:`coursekit.live`, so ``on_update`` can redraw while the run is going.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np

from coursekit import checks, live
from coursekit.data import load_digits, shard
from coursekit.nn import MLP, SGD
from coursekit.runner import Runner

from . import COMPRESSORS, make_compressor
from .base import Diverged
from .communicator import exchange, predict_seconds
from .memory import make_memory


@dataclass(frozen=True)
class Setup:
    """One training run. ``value``: the compressor's parameter (None: its default).

    ``batch_size`` is per worker (the global batch is p times larger); ``lr`` is SGD's.
    """

    compressor: str = "none"
    value: float | int | None = None
    error_feedback: bool = False
    epochs: int = 10
    batch_size: int = 16
    lr: float = 0.1
    hidden: int = 64
    seed: int = 0

    def __post_init__(self):
        if self.compressor not in COMPRESSORS:
            raise ValueError(f"unknown compressor {self.compressor!r}; allowed: "
                             f"{', '.join(COMPRESSORS)}")
        for name in ("epochs", "batch_size", "hidden"):
            checks.integer(getattr(self, name), name, at_least=1)
        checks.real(self.lr, "lr", above=0)
        checks.integer(self.seed, "seed", at_least=0)
        checks.boolean(self.error_feedback, "error_feedback")
        # a bad value fails here, in the notebook, not later on every engine (the workers
        # check PowerSGD's rank again against the real layer sizes)
        make_compressor(self.compressor, self.value, sizes=(self.hidden,) * 3)

    @property
    def label(self) -> str:
        entry = COMPRESSORS[self.compressor]
        value = entry.default if self.value is None else self.value
        name = self.compressor + (f" {entry.param}={value:g}" if entry.param else "")
        return name + (" + EF" if self.error_feedback else "")


@dataclass(frozen=True)
class CompressionResult:
    """Per-epoch curves (index e: after epoch e + 1); bytes and seconds are cumulative.

    ``payload_bytes``/``wire_bytes``: what one rank's payloads held / what it sent (mean
    over ranks); ``seconds``: wall clock of the slowest rank; ``exchange_seconds``: of it,
    the time inside :func:`exchange` (compress, communicate, decompress); ``params``:
    the final parameters of every rank (they must all be equal).
    """

    setup: Setup
    p: int
    steps_per_epoch: int
    n_params: int
    test_accuracy: np.ndarray
    train_loss: np.ndarray
    payload_bytes: np.ndarray
    wire_bytes: np.ndarray
    seconds: np.ndarray
    exchange_seconds: np.ndarray
    params: list

    @property
    def collective(self) -> str:
        """How the compressor's payloads travel: "allreduce", "allgather" or "powersgd"."""
        return COMPRESSORS[self.setup.compressor].cls.collective

    @property
    def final_accuracy(self) -> float:
        return float(self.test_accuracy[-1])

    def predicted_exchange_seconds(self, alpha: float, beta: float) -> np.ndarray:
        """Cost model: cumulative time in exchanges at the end of each epoch (with the
        payload averaged over the run's steps: the model is linear in the bytes)."""
        steps = self.steps_per_epoch * np.arange(1, len(self.test_accuracy) + 1)
        per_step = self.payload_bytes[-1] / steps[-1]
        return steps * predict_seconds(self.collective, self.p, per_step, alpha, beta)

    def predicted_uncompressed_seconds(self, alpha: float, beta: float) -> np.ndarray:
        """Cost model: the same for an uncompressed float32 allreduce of the gradient."""
        steps = self.steps_per_epoch * np.arange(1, len(self.test_accuracy) + 1)
        return steps * predict_seconds("allreduce", self.p, 4 * self.n_params, alpha, beta)


def steps_per_epoch(n_train: int, p: int, batch_size: int) -> int:
    """Steps every rank takes per epoch: the smallest shard's full batches."""
    steps = (n_train // p) // batch_size
    if steps < 1:
        raise ValueError(f"{n_train} training rows over p={p} ranks give less than one batch "
                         f"of {batch_size}; use fewer ranks or a smaller batch")
    return steps


def compressed_exchange(comm, setup: Setup, mlp):
    """The default exchanger: ``grad -> exchange(comm, grad, compressor, memory)`` with
    ``setup``'s compressor (one per rank; stochastic ones seeded by (seed, rank)) and memory."""
    compressor = make_compressor(
        setup.compressor, setup.value, sizes=mlp.sizes,
        rng=setup.seed if setup.compressor == "powersgd"
        else np.random.default_rng([setup.seed, comm.rank]))
    memory = make_memory(setup.error_feedback)
    return lambda grad: exchange(comm, grad, compressor, memory)


def dp_gradient_sum(setup: Setup):
    """Chapter 3's hook: ``data_parallel.train(runner, ..., gradient_sum=dp_gradient_sum(setup))``
    sums the workers' weighted gradients through ``setup``'s compressor and memory instead
    of a plain allreduce (sum = p x the exchanged mean). Picklable, so engines get it too."""
    return functools.partial(_dp_sum, setup)


def _dp_sum(setup: Setup, comm, mlp):
    step = compressed_exchange(comm, setup, mlp)
    return lambda weighted_grad: step(weighted_grad).mean * comm.size


def divergence_advice(setup: Setup, n_params: int) -> str:
    """What to change when ``setup`` diverged: for error feedback with an unbiased
    compressor whose omega > 1 (:meth:`Compressor.variance_bound`), why it blows up."""
    compressor = make_compressor(setup.compressor, setup.value, sizes=(setup.hidden,) * 3)
    omega = compressor.variance_bound(n_params)
    if setup.error_feedback and omega is not None and omega > 1:
        return (f"error feedback adds back x - C(x), and for this unbiased compressor "
                f"E||C(x) - x||^2 reaches {omega:.3g} ||x||^2 on {n_params:,} parameters "
                f"(omega > 1), so the residual grows every step; switch error feedback off "
                f"(an unbiased compressor needs none)")
    return f"lower the learning rate (lr={setup.lr:g}) or compress less"


def train_worker(comm, setup: Setup, data=None, exchanger=compressed_exchange) -> dict:
    """Train on this rank's shard with compressed gradient exchange; return its log.

    ``data``: a :class:`coursekit.data.Dataset` (default: digits). ``exchanger(comm,
    setup, mlp)`` returns this rank's ``step(grad) -> Exchanged`` (the averaged gradient
    and its bytes); the default is :func:`compressed_exchange`, an exercise passes its own.
    """
    data = load_digits() if data is None else data
    p, rank = comm.size, comm.rank
    X, y = shard(data.X_train, data.y_train, rank, p)
    mlp = MLP([data.n_features, setup.hidden, data.n_classes], seed=setup.seed)
    X, y = mlp.check_batch(X, y)
    opt = SGD(mlp.params, setup.lr)
    step = exchanger(comm, setup, mlp)
    steps = steps_per_epoch(len(data.X_train), p, setup.batch_size)
    order_rng = np.random.default_rng([setup.seed, p, rank])
    grad = np.empty_like(mlp.params)
    log = {k: [] for k in ("test_accuracy", "train_loss", "payload_bytes", "wire_bytes",
                           "seconds", "exchange_seconds")}
    reporter = live.Reporter(interval=0.2, series=("test_accuracy",))
    payload = wire = 0
    in_exchange = 0.0
    start = time.perf_counter()
    for epoch in range(1, setup.epochs + 1):
        order = order_rng.permutation(len(X))
        losses = []
        for s in range(steps):
            rows = order[s * setup.batch_size:(s + 1) * setup.batch_size]
            loss, _ = mlp.loss_and_grad(X[rows], y[rows], out=grad, validate=False)
            t0 = time.perf_counter()
            try:  # NaN and overflow are checked here, once, instead of warned about below
                if not np.isfinite(loss):
                    raise Diverged(f"the loss is {loss}")
                with np.errstate(over="ignore", invalid="ignore"):
                    result = step(grad)
                if not np.isfinite(result.mean).all():  # the same on every rank
                    raise Diverged("the averaged gradient is not finite")
            except Diverged as err:
                raise Diverged(f"diverged at epoch {epoch}, step {s + 1} with {setup.label}: "
                               f"{divergence_advice(setup, mlp.n_params)}") from err
            in_exchange += time.perf_counter() - t0
            opt.step(result.mean)
            payload += result.payload_nbytes
            wire += result.wire_nbytes
            losses.append(loss)
        log["test_accuracy"].append(mlp.accuracy(data.X_test, data.y_test))
        log["train_loss"].append(float(np.mean(losses)))
        log["payload_bytes"].append(payload)
        log["wire_bytes"].append(wire)
        log["seconds"].append(time.perf_counter() - start)
        log["exchange_seconds"].append(in_exchange)
        reporter.log(step=len(log["seconds"]), total=setup.epochs,
                     test_accuracy=log["test_accuracy"][-1])
    reporter.close()
    return {**log, "params": mlp.params.copy(), "steps": steps, "n_params": mlp.n_params}


def train(runner: Runner, setup: Setup, data=None, *, workers: int | None = None,
          on_update=None, exchanger=compressed_exchange,
          timeout: float | None = None) -> CompressionResult:
    """Train with the first ``workers`` ranks of ``runner`` (default all of them):
    ThreadComm ranks or a cluster's engines after ``setup_comm`` (:mod:`coursekit.runner`).

    ``on_update(data)``: called with the workers' published progress (one dict per rank,
    ``data[r]["test_accuracy"]`` the curve so far) while the run is going.
    """
    checks.instance(runner, "runner", Runner, " (LocalRunner(n) or ClusterRunner(cluster))")
    checks.instance(setup, "setup", Setup)
    p = runner.size if workers is None else checks.integer(workers, "workers", at_least=1)
    outputs = runner.run(train_worker, setup, data, exchanger, ranks=p, on_update=on_update,
                         timeout=timeout)
    logs = [log for log in outputs if log is not None]

    def column(key, reduce):
        return reduce(np.array([log[key] for log in logs], dtype=float), axis=0)

    return CompressionResult(
        setup=setup, p=p, steps_per_epoch=logs[0]["steps"],
        n_params=logs[0]["n_params"], test_accuracy=np.array(logs[0]["test_accuracy"]),
        train_loss=column("train_loss", np.mean), payload_bytes=column("payload_bytes", np.mean),
        wire_bytes=column("wire_bytes", np.mean), seconds=column("seconds", np.max),
        exchange_seconds=column("exchange_seconds", np.max),
        params=[log["params"] for log in logs])


__all__ = ["CompressionResult", "Setup", "compressed_exchange", "divergence_advice",
           "dp_gradient_sum", "steps_per_epoch", "train", "train_worker"]
