"""PyTorch DDP beside chapter 3's synchronous allreduce SGD, on the same engines.

Both sides start from the same weights (the course's ``MLP(sizes, float64, seed)``, copied
into torch by :func:`.torch_mlp.to_torch`), read the same rows (worker k of p takes the k-th
part of each global batch of B rows, :class:`~coursekit.parallel.data_parallel.sampler.Sampler`)
and apply SGD with momentum (v <- mu v + g, w <- w - eta v, both libraries' convention):

* the course: ``train_worker`` weights its mean gradient by n_k / B and sum-allreduces it
  (ring), in buckets of ``bucket_bytes`` cut from the END of the flat buffer;
* DDP: each rank's mean gradient, bucket by bucket, divided by p and sum-allreduced (gloo);
  the same thing when every rank has B / p rows, which :func:`ddp_experiment` requires
  (DDP weighs every rank 1/p, it does not know n_k).

So g = (1/p) sum_k g_k on both sides, the parameters agree after every step to float64
rounding (the reduction orders differ), and both equal serial SGD on the whole batch.

**Buckets.** DDP never splits a tensor: it packs whole parameters, in the order their
gradients become ready (b_L, W_L, b_{L-1}, W_{L-1}, ...), into a bucket until the bucket
holds at least ``bucket_cap_mb`` MiB, then opens the next one (:func:`ddp_bucket_plan`). Its
first step runs with ONE bucket of every parameter: DDP learns the ready order during that
backward and rebuilds its buckets before the second. The course cuts the flat buffer into
slices of at most the cap (``make_buckets``), so it has ceil(n / cap) buckets, DDP at most as
many. Each bucket is one allreduce, so the latency term alpha is paid once per bucket.

**Bytes.** A ring allreduce of n elements of s bytes sends 2 (p-1)/p n s bytes from every
rank (on average over ranks; exact when p divides n). Summed over the buckets of a step,
both sides send 2 (p-1)/p N 8 bytes per rank per step for N float64 parameters: buckets
change the number of messages, not the bytes. DDP's count comes from a communication hook
that records every ``GradBucket`` (then averages it as DDP's default hook does); the
course's from its trace.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from coursekit import checks
from coursekit.comm.trace import now
from coursekit.nn.layout import check_sizes, layer_slices, n_params
from coursekit.nn.mlp import MLP
from coursekit.nn.optim import make_optimizer
from coursekit.parallel.data_parallel import DPConfig, train_worker
from coursekit.parallel.data_parallel.buckets import make_buckets
from coursekit.parallel.data_parallel.sampler import Sampler

from .requirement import import_torch
from .torch_group import digits_or, process_group, torch_ranks
from .torch_mlp import course_names, flat_params, to_torch

__all__ = ["DDPBucket", "DDPConfig", "DDPResult", "course_steps", "ddp_bucket_plan",
           "ddp_experiment", "ring_bytes", "serial_reference"]

ITEMSIZE = 8  # float64
#: |DDP - course| allowed after a step: float64, the two sides reduce in different orders
TOLERANCE = 1e-12
MIB = 1 << 20  # torch's bucket_cap_mb is in MiB: int(bucket_cap_mb * 1024 * 1024) bytes


@dataclass(frozen=True)
class DDPConfig:
    """One DDP-vs-course run: the MLP ``sizes`` (hidden ReLU, softmax cross-entropy,
    float64, initial weights from ``seed``), ``steps`` steps on global batches of
    ``batch_size`` rows (the first epoch's shuffled order from ``seed``), SGD with ``lr`` and
    ``momentum``, gradient buckets of ``bucket_cap_mb`` MiB on both sides (25 is DDP's
    default). The number of workers is ``ddp_experiment``'s ``workers=``."""

    sizes: tuple = (64, 32, 10)
    steps: int = 5
    batch_size: int = 64
    bucket_cap_mb: float = 25.0
    lr: float = 0.1
    momentum: float = 0.9
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "sizes", check_sizes(self.sizes))
        checks.integer(self.steps, "steps", at_least=1, at_most=1000)
        checks.integer(self.batch_size, "batch_size", at_least=1,
                       hint=" (the global batch, split over the workers)")
        checks.real(self.bucket_cap_mb, "bucket_cap_mb", above=0,
                    hint=" (MiB per gradient bucket; DDP's default is 25)")
        checks.real(self.lr, "lr", above=0)
        checks.real(self.momentum, "momentum", at_least=0, below=1)
        checks.integer(self.seed, "seed", at_least=0)

    @property
    def bucket_bytes(self) -> int:
        """The cap in bytes, as DDP computes it: int(bucket_cap_mb * 2^20)."""
        return max(1, int(self.bucket_cap_mb * MIB))

    def course_config(self) -> DPConfig:
        """Chapter 3's config of the same run (its buckets of at most :attr:`bucket_bytes`)."""
        return DPConfig(sizes=self.sizes, dtype="float64", seed=self.seed,
                        batch_size=self.batch_size, max_steps=self.steps, lr=self.lr,
                        momentum=self.momentum, bucket_bytes=self.bucket_bytes,
                        timeline_steps=self.steps)

    def check_workers(self, p: int, n_rows: int) -> None:
        """ValueError unless every worker gets B / p rows of every one of the steps."""
        if self.batch_size % p:
            raise ValueError(f"batch_size={self.batch_size} must be a multiple of workers={p}: "
                             "DDP averages the ranks' gradients with weight 1/p, which is the "
                             "batch's gradient only when every rank has B/p rows")
        if self.steps * self.batch_size > n_rows:
            raise ValueError(f"steps={self.steps} of batch_size={self.batch_size} need "
                             f"{self.steps * self.batch_size} rows (full batches of the first "
                             f"epoch); the data has {n_rows}: use at most "
                             f"{n_rows // self.batch_size} steps")


@dataclass(frozen=True)
class DDPBucket:
    """A bucket DDP's communication hook saw: at ``step`` (0-based), bucket ``index``,
    ``numel`` float64 elements, holding the course's parameters ``names`` (W1, b1, ...)."""

    step: int
    index: int
    numel: int
    names: tuple


def ddp_bucket_plan(sizes, bucket_cap_mb: float) -> list[tuple]:
    """DDP's buckets from its second step on: the parameters' course names per bucket.

    Parameters in gradient-ready order (b_L, W_L, ..., b_1, W_1), a bucket closed once it
    holds >= int(bucket_cap_mb * 2^20) bytes (float64); its first step has one bucket."""
    cap = DDPConfig(sizes=sizes, bucket_cap_mb=bucket_cap_mb).bucket_bytes
    plan, bucket, held = [], [], 0
    for s in reversed(layer_slices(sizes)):
        for name, numel in ((f"b{s.index + 1}", s.n_out), (f"W{s.index + 1}", s.n_in * s.n_out)):
            bucket.append(name)
            held += numel * ITEMSIZE
            if held >= cap:
                plan.append(tuple(bucket))
                bucket, held = [], 0
    return plan + ([tuple(bucket)] if bucket else [])


def ring_bytes(numel, p: int, itemsize: int = ITEMSIZE) -> float:
    """Bytes each rank sends in a ring allreduce of ``numel`` elements: 2(p-1)/p n s."""
    return 2 * (p - 1) / p * np.sum(numel) * itemsize


@dataclass(frozen=True)
class DDPResult:
    """Per step t (0-based) the parameters after it, in the course's flat layout:
    ``course_params``, ``ddp_params`` (rank 0's; every rank's were equal) and
    ``serial_params`` (serial SGD on the whole batch), each (steps, N). ``course_buckets``:
    the course's (start, stop) element ranges; ``ddp_buckets``: what DDP's hook saw
    (rank 0). ``course_sent``: bytes each rank sent per step (its trace, (p,));
    ``ddp_sent``: per rank per step from the hook's bucket sizes and the ring formula,
    (p, steps). ``course_step_s`` / ``ddp_step_s``: (p, steps) seconds of each step without
    reading the rows (forward, backward, exchange, update)."""

    config: DDPConfig
    workers: int
    course_params: np.ndarray
    ddp_params: np.ndarray
    serial_params: np.ndarray
    course_buckets: list
    ddp_buckets: list
    course_sent: np.ndarray
    ddp_sent: np.ndarray
    course_step_s: np.ndarray
    ddp_step_s: np.ndarray

    @property
    def n_params(self) -> int:
        return self.course_params.shape[1]

    @property
    def max_diff(self) -> np.ndarray:
        """max |w_DDP - w_course| after each step."""
        return np.abs(self.ddp_params - self.course_params).max(axis=1)

    @property
    def max_diff_serial(self) -> np.ndarray:
        """max |w_DDP - w_serial| after each step."""
        return np.abs(self.ddp_params - self.serial_params).max(axis=1)

    def buckets_at(self, step: int) -> list[DDPBucket]:
        """DDP's buckets of ``step``, in the order its hook saw them."""
        return [b for b in self.ddp_buckets if b.step == step]

    @property
    def bytes_formula(self) -> float:
        """2(p-1)/p N 8: what each rank sends per step on either side."""
        return ring_bytes(self.n_params, self.workers)

    @property
    def time_per_step(self) -> tuple[float, float]:
        """(course, DDP): median over steps of the slowest rank's step, in seconds."""
        return (float(np.median(self.course_step_s.max(axis=0))),
                float(np.median(self.ddp_step_s.max(axis=0))))


class _BucketLog:
    """A DDP communication hook that records every bucket, then averages it as DDP's
    default hook does (divide by p, sum-allreduce)."""

    def __init__(self, model):
        self.names, self.step, self.buckets = course_names(model), 0, []

    def hook(self, state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        self.buckets.append(DDPBucket(self.step, bucket.index(), bucket.buffer().numel(),
                                      tuple(self.names[id(p)] for p in bucket.parameters())))
        return allreduce_hook(None, bucket)


def course_steps(comm, cfg: DDPConfig, data):
    """On every rank: chapter 3's ``train_worker`` run for 1, 2, ..., steps steps. Returns
    (the parameters after each step (steps, N), bytes this rank sent per step (its trace),
    the last run's seconds per step)."""
    dp = cfg.course_config()
    runs = [train_worker(comm, replace(dp, max_steps=t), data) for t in range(1, cfg.steps + 1)]
    sent = sum(m.nbytes for m in runs[-1].trace if m.op == "send") / cfg.steps
    return np.stack([r.params for r in runs]), sent, runs[-1].step_s


def _ddp_steps(comm, cfg: DDPConfig, data):
    """DDP on the same rows from the same weights: parameters, buckets, seconds per step."""
    torch = import_torch()
    from torch.nn.parallel import DistributedDataParallel
    X, y = data
    sampler = Sampler(len(X), cfg.batch_size, cfg.seed)
    params, seconds = [], []
    model = to_torch(MLP(cfg.sizes, dtype=np.float64, seed=cfg.seed))
    ddp = DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_cap_mb)
    log = _BucketLog(model)
    ddp.register_comm_hook(None, log.hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    for step in range(cfg.steps):
        rows, _ = sampler.local(step, comm.rank, comm.size)
        Xk, yk = torch.from_numpy(X[rows]), torch.from_numpy(y[rows].astype(np.int64))
        log.step, t0 = step, now()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(Xk), yk).backward()
        optimizer.step()
        seconds.append(now() - t0)
        params.append(flat_params(model))
    return np.stack(params), log.buckets, np.array(seconds)


def _on_rank(comm, cfg: DDPConfig, data):
    torch = import_torch()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like the course's kernels (NUMBA_NUM_THREADS=1 on engines)
    try:
        course = course_steps(comm, cfg, data)
        with process_group(comm, "gloo"):  # CPU float64 tensors, as on the course's side
            return course, _ddp_steps(comm, cfg, data)
    finally:
        torch.set_num_threads(threads)


def serial_reference(config: DDPConfig, X, y) -> np.ndarray:
    """Serial SGD on the whole batch of each step (the same rows, the same start):
    the parameters after every step, (steps, N)."""
    mlp = MLP(config.sizes, dtype=np.float64, seed=config.seed)
    opt = make_optimizer(mlp.params, config.lr, config.momentum)
    sampler, out = Sampler(len(X), config.batch_size, config.seed), []
    for step in range(config.steps):
        rows = sampler.batch(step)
        opt.step(mlp.loss_and_grad(X[rows], y[rows])[1])
        out.append(mlp.params.copy())
    return np.stack(out)


def ddp_experiment(runner, config: DDPConfig, data=None, *, workers: int | None = None,
                   timeout: float | None = None) -> DDPResult:
    """Run chapter 3's synchronous allreduce SGD and DDP on the first ``workers`` engines of
    ``runner`` (a ClusterRunner: torch's process group is one per process, so not on
    threads), ``data`` an (X, y) pair (default: the digits' training set, float64).

    Raises RuntimeError if the ranks of one side end a step with different parameters."""
    checks.instance(config, "config", DDPConfig)
    X, y = digits_or(data, features=config.sizes[0])
    if y.min() < 0 or y.max() >= config.sizes[-1]:
        raise ValueError(f"data: labels must lie in [0, {config.sizes[-1]}) (sizes[-1])")
    p = torch_ranks(runner, runner.size if workers is None else workers, "torch.nn.parallel")
    config.check_workers(p, len(X))
    out = runner.run(_on_rank, config, (X, y), ranks=p, timeout=timeout)
    course = [o[0] for o in out]
    ddp = [o[1] for o in out]
    for side, ranks in (("course", [c[0] for c in course]), ("DDP", [d[0] for d in ddp])):
        if any(not np.array_equal(r, ranks[0]) for r in ranks[1:]):
            raise RuntimeError(f"the {side}'s ranks ended a step with different parameters")
    sent = np.array([[ring_bytes([b.numel for b in d[1] if b.step == t], p)
                      for t in range(config.steps)] for d in ddp])
    buckets = make_buckets(n_params(config.sizes), ITEMSIZE, config.bucket_bytes)
    return DDPResult(config, p, course[0][0], ddp[0][0], serial_reference(config, X, y),
                     [(b.start, b.stop) for b in buckets], ddp[0][1],
                     np.array([c[1] for c in course]), sent,
                     np.stack([c[2] for c in course]), np.stack([d[2] for d in ddp]))
