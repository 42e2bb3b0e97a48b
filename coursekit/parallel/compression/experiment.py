"""Data-parallel SGD on digits with compressed gradients: the chapter's experiment.

Chapter 3's synchronous data-parallel training (:func:`coursekit.parallel.data_parallel.train`,
the same loop, sampler and update) with the gradient sum replaced by a compressed
exchange, through that loop's ``gradient_sum`` hook. On worker k of p, with weight
w_k = n_k / B (1/p when p divides the global batch B)::

    x_k = p w_k g_k                  (this worker's mean gradient when the split is even)
    mean = (1/p) sum_k C(x_k + e_k)   :func:`~.communicator.exchange`: compressor C, memory e_k
    w <- w - lr * mean                the serial step when C is the identity

:class:`GradientSum` is that hook; it records per step the bytes of the worker's payload,
the bytes it sent and the seconds spent exchanging, and stops a run whose gradients are
no longer finite (:class:`~.base.Diverged`, with advice). The exchange per rank is
pluggable (``exchanger``) so that an exercise can bring its own.

:func:`train` runs it on the first p ranks of a runner (ThreadComm ranks in this process
or a cluster's engines, :mod:`coursekit.cluster.runner`) and returns a :class:`CompressionResult`
of per-epoch curves. Rank 0 publishes the test accuracy after every epoch
(:mod:`coursekit.cluster.live`: ``data[0]["evals"]``), so ``on_update`` can redraw while it runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from coursekit import checks
from coursekit.data import Dataset, load_digits
from coursekit.nn.mlp import check_device
from coursekit.parallel import data_parallel
from coursekit.parallel.data_parallel import DPConfig
from coursekit.cluster.runner import Runner

from . import COMPRESSORS, make_compressor
from .base import Diverged
from .communicator import exchange, predict_seconds
from .memory import make_memory


@dataclass(frozen=True)
class CompressionConfig:
    """One training run. ``value``: the compressor's parameter (None: its default).

    ``batch_size`` is per worker (the global batch is p times larger); ``lr`` is SGD's;
    ``seed``: the initial weights, the shuffling and the stochastic compressors.
    ``device``: where the workers compute their gradients, as :class:`DPConfig`'s ("cpu",
    "cuda", "auto"); the compressed exchange itself runs on the host.
    """

    compressor: str = "none"
    value: float | int | None = None
    error_feedback: bool = False
    epochs: int = 10
    batch_size: int = 16
    lr: float = 0.1
    hidden: int = 64
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self):
        if self.compressor not in COMPRESSORS:
            raise ValueError(f"unknown compressor {self.compressor!r}; allowed: "
                             f"{', '.join(COMPRESSORS)}")
        for name in ("epochs", "batch_size", "hidden"):
            checks.integer(getattr(self, name), name, at_least=1)
        checks.real(self.lr, "lr", above=0)
        checks.integer(self.seed, "seed", at_least=0)
        checks.boolean(self.error_feedback, "error_feedback")
        check_device(self.device)
        # the model (n_features, hidden, n_classes) has at least 4 x hidden float32 weights
        checks.fits_in_memory(4 * 4 * self.hidden, f"hidden={self.hidden}",
                              f"a model with {self.hidden:,} hidden units (at least 4 x hidden "
                              f"float32 parameters)")
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
    over ranks); ``seconds``: training time, a step lasting as long as its slowest rank
    (chapter 3's convention; reading data and evaluating excluded); ``exchange_seconds``:
    of it, the slowest rank's time inside :func:`exchange` (compress, communicate,
    decompress); ``params``: the final parameters of every rank (they must all be equal);
    ``devices``: where each rank computed ("cpu" or "cuda:<id>").
    """

    config: CompressionConfig
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
    devices: list

    @property
    def collective(self) -> str:
        """How the compressor's payloads travel: "allreduce", "allgather" or "powersgd"."""
        return COMPRESSORS[self.config.compressor].cls.collective

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


def compressed_exchange(comm, config: CompressionConfig, mlp):
    """The default exchanger: ``grad -> exchange(comm, grad, compressor, memory)`` with
    ``config``'s compressor (one per rank; stochastic ones seeded by (seed, rank)) and memory."""
    compressor = make_compressor(
        config.compressor, config.value, sizes=mlp.sizes,
        rng=config.seed if config.compressor == "powersgd"
        else np.random.default_rng([config.seed, comm.rank]))
    memory = make_memory(config.error_feedback)
    return lambda grad: exchange(comm, grad, compressor, memory)


def divergence_advice(config: CompressionConfig, n_params: int) -> str:
    """What to change when ``config`` diverged: for error feedback with an unbiased
    compressor whose omega > 1 (:meth:`Compressor.variance_bound`), why it blows up."""
    compressor = make_compressor(config.compressor, config.value, sizes=(config.hidden,) * 3)
    omega = compressor.variance_bound(n_params)
    if config.error_feedback and omega is not None and omega > 1:
        return (f"error feedback adds back x - C(x), and for this unbiased compressor "
                f"E||C(x) - x||^2 reaches {omega:.3g} ||x||^2 on {n_params:,} parameters "
                f"(omega > 1), so the residual grows every step; switch error feedback off "
                f"(an unbiased compressor needs none)")
    return f"lower the learning rate (lr={config.lr:g}) or compress less"


class GradientSum:
    """Chapter 3's ``gradient_sum`` hook with ``config``'s compressed exchange (see the module
    docstring): ``data_parallel.train(runner, dp, data, gradient_sum=GradientSum(config))``.

    ``exchanger(comm, config, mlp)`` builds each rank's ``step(x) -> Exchanged`` (default:
    :func:`compressed_exchange`). ``steps_per_epoch`` only words the divergence message.
    Picklable when ``exchanger`` is, so engines get it too.
    """

    def __init__(self, config: CompressionConfig, exchanger=compressed_exchange,
                 steps_per_epoch: int | None = None):
        self.config = checks.instance(config, "config", CompressionConfig)
        if not callable(exchanger):
            raise TypeError(f"exchanger must be a callable (comm, config, mlp) -> step; "
                            f"got {type(exchanger).__name__}")
        self.exchanger, self.steps_per_epoch = exchanger, steps_per_epoch

    def __call__(self, comm, mlp) -> "RankGradientSum":
        return RankGradientSum(self, comm, mlp)


class RankGradientSum:
    """One rank's side of :class:`GradientSum`: ``sum_k w_k g_k`` from ``w_k g_k``, and a
    ``log`` of cumulative bytes and seconds (returned with the rank's result)."""

    def __init__(self, hook: GradientSum, comm, mlp):
        self.hook, self.comm, self.n_params = hook, comm, mlp.n_params
        self.step = hook.exchanger(comm, hook.config, mlp)
        self.log = {"payload_bytes": [], "wire_bytes": [], "exchange_seconds": []}
        self.payload = self.wire = 0
        self.seconds = 0.0

    def __call__(self, weighted_grad: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        try:  # the compressor refuses a non-finite gradient (Diverged) before sending
            with np.errstate(over="ignore", invalid="ignore"):
                result = self.step(weighted_grad * self.comm.size)
            if not np.isfinite(result.mean).all():  # the same on every rank
                raise Diverged("the averaged gradient is not finite")
        except Diverged as err:
            raise Diverged(f"diverged at {self._when()} with {self.hook.config.label}: "
                           f"{divergence_advice(self.hook.config, self.n_params)}") from err
        self.seconds += time.perf_counter() - t0
        self.payload += result.payload_nbytes
        self.wire += result.wire_nbytes
        for key, value in (("payload_bytes", self.payload), ("wire_bytes", self.wire),
                           ("exchange_seconds", self.seconds)):
            self.log[key].append(value)
        return result.mean

    def _when(self) -> str:
        step, per_epoch = len(self.log["wire_bytes"]), self.hook.steps_per_epoch
        if per_epoch:
            return f"epoch {step // per_epoch + 1}, step {step % per_epoch + 1}"
        return f"step {step + 1}"


def dp_config(config: CompressionConfig, data, p: int) -> DPConfig:
    """Chapter 3's settings for ``config`` on p workers: the global batch is p x the
    per-worker batch, whole gradients are summed (the hook), rank 0 evaluates every epoch,
    the workers compute on ``config.device``."""
    dp = DPConfig(sizes=(data.n_features, config.hidden, data.n_classes), seed=config.seed,
                  batch_size=config.batch_size * p, epochs=config.epochs, lr=config.lr,
                  timeline_steps=0, device=config.device)
    return replace(dp, eval_every=dp.total_steps(len(data.X_train)) // config.epochs)


def train(runner: Runner, config: CompressionConfig, data=None, *, workers: int | None = None,
          on_update=None, exchanger=compressed_exchange,
          timeout: float | None = None) -> CompressionResult:
    """Train with the first ``workers`` ranks of ``runner`` (default all of them):
    ThreadComm ranks or a cluster's engines after ``setup_comm`` (:mod:`coursekit.cluster.runner`).

    ``data``: a :class:`coursekit.data.Dataset` (default: digits). ``on_update(data)``:
    called with the workers' published progress while the run is going (rank 0's
    ``data[0]["evals"]``: (step, test accuracy) after every epoch so far).
    """
    checks.instance(runner, "runner", Runner, " (LocalRunner(n) or ClusterRunner(cluster))")
    checks.instance(config, "config", CompressionConfig)
    p = runner.check_workers(workers)  # before loading the data: a bad value fails at once
    data = load_digits() if data is None else checks.instance(data, "data", Dataset)
    dp = dp_config(config, data, p)
    hook = GradientSum(config, exchanger, dp.eval_every)
    run = data_parallel.train(runner, dp, (data.X_train, data.y_train),
                              (data.X_test, data.y_test), workers=p, gradient_sum=hook,
                              on_update=on_update, timeout=timeout)
    return _per_epoch(config, run)


def _per_epoch(config: CompressionConfig, run: data_parallel.DPResult) -> CompressionResult:
    """The run's per-step arrays read at the end of every epoch."""
    per_epoch = run.config.eval_every
    ends = per_epoch * np.arange(1, config.epochs + 1) - 1
    logs = run.hook_logs

    def at_ends(key, reduce):
        return reduce(np.array([log[key] for log in logs], dtype=float), axis=0)[ends]

    return CompressionResult(
        config=config, p=run.n_workers, steps_per_epoch=per_epoch, n_params=run.params.size,
        test_accuracy=np.asarray(run.test_accuracy, float),
        train_loss=run.loss.reshape(config.epochs, per_epoch).mean(axis=1),
        payload_bytes=at_ends("payload_bytes", np.mean), wire_bytes=at_ends("wire_bytes", np.mean),
        seconds=np.cumsum(run.step_s.max(axis=0))[ends],
        exchange_seconds=at_ends("exchange_seconds", np.max), params=run.rank_params,
        devices=run.devices)


__all__ = ["CompressionConfig", "CompressionResult", "GradientSum", "RankGradientSum",
           "compressed_exchange", "divergence_advice", "dp_config", "train"]
