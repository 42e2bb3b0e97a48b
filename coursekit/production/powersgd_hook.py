"""DDP's PowerSGD communication hook beside chapter 6's PowerSGD.

Both sides train the chapter-6 MLP (64 - ``hidden`` - 10, ReLU, float64, the same seed) with
data-parallel SGD on p workers, the same shard of the same global batch on each worker,
w <- w - lr * mean. The mean of the workers' gradients is

* for the first ``start_iter`` steps, a plain allreduce (torch's hook runs vanilla
  allreduce before ``start_powerSGD_iter``; the course runs chapter 6's ``exchange`` with
  no compression);
* then PowerSGD of rank r on every weight matrix M (m x n), biases uncompressed, with
  error feedback x_w = g_w + e_w when ``error_feedback``:

      P = mean_w(M_w) Q,  P^ = orth(P),  Q = mean_w(M_w)^T P^,  C = P^ Q^T,

  Q warm-started from the previous step. The course: ``exchange(comm, g, PowerSGD.for_mlp(...),
  ErrorFeedback())``; torch: ``DistributedDataParallel`` with ``powerSGD_hook`` and
  ``PowerSGDState(matrix_approximation_rank=r, start_powerSGD_iter=start_iter,
  min_compression_rate=1, use_error_feedback, warm_start=True)``.

Why the two can agree to rounding (:data:`RTOL`), and what differs:

* The initial Q is random on both sides (the course: ``default_rng([seed, i])``; torch:
  its own generator), so torch's Q is replaced by the course's before its first
  compressed step (:func:`seed_torch_q`, in torch's layout of ``q_memory_dict``).
* Torch orthogonalizes the warm-start Q before P = M Q; the course does not. C depends
  only on the column span of M Q, and Q -> Q R^{-1} (R invertible, upper triangular) keeps
  it, so C is the same; Q itself may differ by column signs.
* The course's residual is e_w = x_w - P^ Q_w^T (this worker's contribution), torch's
  e_w = x_w - C (the mean). They differ per worker, but their mean over workers is the
  same, mean_w(x_w) - C, and PowerSGD sees only mean_w(M_w) (P and Q are allreduced, and
  linear in M): so every step's C is the same. :attr:`PowerSGDComparison.residual_mean_error`
  checks the means.
* ``min_compression_rate=1``: torch compresses a matrix only when (m + n) r < m n, and it
  would also "compress" a bias (an n x 1 matrix) with a smaller rate; with 1 it compresses
  every weight matrix and no bias, as the course does (the config refuses a rank for which
  (m + n) r >= m n somewhere: torch would send that matrix whole).
* ``warm_start=True`` always: the course always warm-starts (torch's ``warm_start=False``
  draws a new random Q every step, which the course has no twin of); with error feedback
  or warm start torch requires ``start_powerSGD_iter >= 2``.

Bytes each worker hands to allreduce per compressed step, both sides (counted: the
course's payloads, torch's tensors passed to ``dist.all_reduce``):
8 (sum over matrices of (m + n) r + biases), instead of 8 n_params uncompressed; the course
in two allreduces (P with the biases, then Q), torch in three (biases, Ps, Qs). On the
wire a ring allreduce of b bytes sends 2(p-1)/p b per rank: counted by the course's trace;
gloo's own wire is not visible, so torch's is that formula applied to its counted bytes.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np

from coursekit import checks

from . import course_mlp
from .requirement import import_torch
from .torch_group import digits_or, torch_ranks

RTOL = 1e-9
"""Relative tolerance of the parameters (float64; the allreduce orders and the QR/Gram-Schmidt
kernels differ, and PowerSGD's orthogonalization amplifies rounding a little each step)."""
TRAIN_ROWS = 1347  # digits training set


@dataclass(frozen=True)
class PowerSGDConfig:
    """``workers`` data-parallel workers, ``batch_size`` rows each per step, ``steps`` SGD
    steps of learning rate ``lr``; PowerSGD of rank ``rank`` from step ``start_iter`` on
    (>= 2: torch's rule with warm start), with ``error_feedback``; MLP 64-``hidden``-10."""

    workers: int = 4
    rank: int = 2
    start_iter: int = 2
    error_feedback: bool = True
    steps: int = 20
    batch_size: int = 16
    hidden: int = 64
    lr: float = 0.1
    seed: int = 0

    def __post_init__(self):
        checks.integer(self.workers, "workers", at_least=2)
        r = checks.integer(self.rank, "rank", at_least=1, hint=" (matrix_approximation_rank)")
        steps = checks.integer(self.steps, "steps", at_least=1)
        checks.integer(self.start_iter, "start_iter", at_least=2, at_most=steps - 1,
                       hint=" (torch's start_powerSGD_iter: >= 2 with warm start or error "
                            "feedback, and below steps so that PowerSGD runs)")
        checks.boolean(self.error_feedback, "error_feedback")
        checks.integer(self.batch_size, "batch_size", at_least=1,
                       at_most=TRAIN_ROWS // self.workers,
                       hint=" (rows per worker; the workers' shards of a step must fit in the "
                            f"{TRAIN_ROWS} training digits)")
        checks.integer(self.hidden, "hidden", at_least=1, at_most=4096)
        checks.real(self.lr, "lr", above=0)
        checks.integer(self.seed, "seed", at_least=0)
        for rows, cols in self.matrices:
            if (rows + cols) * r >= rows * cols:
                raise ValueError(f"rank={r}: a {rows} x {cols} matrix would take (m + n) r = "
                                 f"{(rows + cols) * r} >= m n = {rows * cols} numbers, so torch "
                                 "sends it uncompressed (min_compression_rate=1) while the "
                                 f"course compresses it; allowed: rank < m n / (m + n) for "
                                 f"every matrix, here rank <= {self.max_rank}")

    @property
    def sizes(self) -> tuple[int, ...]:
        return (64, self.hidden, 10)

    @property
    def matrices(self) -> list[tuple[int, int]]:
        return list(zip(self.sizes[:-1], self.sizes[1:]))

    @property
    def max_rank(self) -> int:
        """The largest rank that compresses every weight matrix: (m + n) r < m n."""
        return min((a * b - 1) // (a + b) for a, b in self.matrices)


def payload_bytes(config: PowerSGDConfig, compressed: bool = True) -> int:
    """Bytes each worker allreduces per step: 8 (sum of (m + n) r + biases) with PowerSGD,
    8 n_params without."""
    biases = sum(b for _, b in config.matrices)
    if not compressed:
        return 8 * (sum(a * b for a, b in config.matrices) + biases)
    return 8 * (sum((a + b) * config.rank for a, b in config.matrices) + biases)


@dataclass(frozen=True)
class PowerSGDComparison:
    """Per step t: ``loss``/``torch_loss`` (mean over workers of their shard's loss before
    the step), ``param_error`` (max |torch - course| / max |course| over the workers);
    ``residual_mean_error``: at the end, max |mean_w e_w (torch) - mean_w e_w (course)| /
    max |mean_w e_w (course)| (0 without error feedback), ``residual_worker_error``: the
    same for the workers' own residuals (they differ: see the module doc); ``course_payload[t]``/
    ``torch_payload[t]``: bytes one worker handed to allreduce in step t (the same on every
    worker; torch's ``torch_allreduces[t]`` calls); ``course_wire[t, w]``: bytes worker w
    sent (trace); ``course_seconds``/``torch_seconds``: per step, the slowest worker;
    ``accuracy``/``torch_accuracy``: on the training set after the last step."""

    config: PowerSGDConfig
    loss: np.ndarray
    torch_loss: np.ndarray
    param_error: np.ndarray
    residual_mean_error: float
    residual_worker_error: float
    course_payload: np.ndarray
    torch_payload: np.ndarray
    torch_allreduces: np.ndarray
    course_wire: np.ndarray
    course_seconds: np.ndarray
    torch_seconds: np.ndarray
    accuracy: float
    torch_accuracy: float

    @property
    def ring_wire(self) -> np.ndarray:
        """2(p-1)/p x the payload: the bytes a ring allreduce of it sends per rank."""
        p = self.config.workers
        return 2 * (p - 1) * self.torch_payload / p


def _course_q(config: PowerSGDConfig, layer: int, cols: int) -> np.ndarray:
    """The course's initial Q of matrix ``layer`` (:class:`.lowrank.PowerSGD`'s ``_start``)."""
    return np.random.default_rng([config.seed, layer]).standard_normal((cols, config.rank))


def seed_torch_q(state, bucket, layer_of: dict, config: PowerSGDConfig) -> None:
    """Put the course's initial Q of every matrix into ``state.q_memory_dict`` for this
    bucket, in the order ``powerSGD_hook`` lays them out (the bucket's 2-D gradients grouped
    by shape, in order of first appearance), so that it warm-starts from them."""
    torch = import_torch()
    groups: dict = {}
    for param in bucket.parameters():
        if param.dim() == 2:
            groups.setdefault(tuple(param.shape), []).append(param)
    qs, n_ps = [], 0
    for (rows, cols), params in groups.items():
        for param in params:
            qs.append(_course_q(config, layer_of[id(param)], cols).ravel())
            n_ps += rows * config.rank
    index = bucket.index()
    state.p_memory_dict[index] = torch.empty(n_ps, dtype=torch.float64)
    state.q_memory_dict[index] = torch.from_numpy(np.concatenate(qs))


@contextlib.contextmanager
def counting_allreduce(counts: list):
    """Inside the block, every ``torch.distributed.all_reduce`` appends its tensor's bytes
    to ``counts`` (the hooks call it through the module, so this sees their calls)."""
    dist = import_torch().distributed
    real = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        counts.append(tensor.numel() * tensor.element_size())
        return real(tensor, *args, **kwargs)

    dist.all_reduce = counted
    try:
        yield counts
    finally:
        dist.all_reduce = real


def _bucket_residual(state, bucket_views, n_params) -> np.ndarray:
    """torch's error feedback residual in the course's flat layout."""
    out = np.zeros(n_params)
    for index, views in bucket_views.items():
        error = state.error_dict[index].numpy()
        for start, span in views:
            out[span] = error[start:start + span.stop - span.start]
    return out


def _rank_compare(comm, config: PowerSGDConfig, X, y):
    """Engine side: both trainings on this worker, step by step."""
    torch = import_torch()
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel

    from coursekit.comm.trace import recording
    from coursekit.nn import MLP
    from coursekit.parallel.compression import NoCompression, PowerSGD, exchange, make_memory

    from .torch_group import process_group

    p, w = comm.size, comm.rank
    mlp = MLP(config.sizes, "relu", dtype=np.float64, seed=config.seed)
    layers = range(len(mlp.layers))
    module = course_mlp.layers_module(mlp, layers)
    compressor = PowerSGD.for_mlp(config.sizes, config.rank, seed=config.seed)
    memory = make_memory(config.error_feedback)
    B, b = p * config.batch_size, config.batch_size
    order = np.random.default_rng(config.seed).permutation(len(X))
    out = {k: [] for k in ("loss", "torch_loss", "param", "payload", "torch_payload",
                           "torch_calls", "wire", "course_s", "torch_s")}
    # parameter -> course layer (for the Qs), and its place in the flat layout
    linears = [m for m in module if hasattr(m, "weight")]
    layer_of = {id(lin.weight): l for l, lin in zip(layers, linears)}
    span_of = {}
    for l, lin in zip(layers, linears):
        s = mlp.layers[l].span
        span_of[id(lin.weight)] = slice(s.start, s.start + lin.weight.numel())
        span_of[id(lin.bias)] = slice(s.start + lin.weight.numel(), s.stop)
    bucket_views: dict = {}

    def hook(state, bucket):
        if state.iter >= state.start_powerSGD_iter and bucket.index() not in state.p_memory_dict:
            seed_torch_q(state, bucket, layer_of, config)
        base = bucket.buffer().data_ptr()
        bucket_views[bucket.index()] = [
            ((g.data_ptr() - base) // g.element_size(), span_of[id(param)])
            for param, g in zip(bucket.parameters(), bucket.gradients())]
        return psgd.powerSGD_hook(state, bucket)

    with process_group(comm, "gloo"):  # CPU float64 tensors, as on the course's side
        ddp = DistributedDataParallel(module)
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=config.rank,
                                   start_powerSGD_iter=config.start_iter, min_compression_rate=1,
                                   use_error_feedback=config.error_feedback, warm_start=True,
                                   random_seed=config.seed)
        ddp.register_comm_hook(state, hook)
        for t in range(config.steps):
            rows = order[(t * B + w * b + np.arange(b)) % len(X)]
            Xw, yw = X[rows], y[rows]
            compressed = t >= config.start_iter
            comm.barrier()
            t0 = time.perf_counter()
            with recording(comm) as messages:
                loss, grad = mlp.loss_and_grad(Xw, yw)
                ex = exchange(comm, grad, compressor if compressed else NoCompression(),
                              memory if compressed else None)
                mlp.params -= config.lr * ex.mean
                out["course_s"].append(time.perf_counter() - t0)
                out["wire"].append(sum(m.nbytes for m in messages() if m.op == "send"))
            out["payload"].append(ex.payload_nbytes)
            out["loss"].append(loss)
            torch.distributed.barrier()
            counts = []
            t0 = time.perf_counter()
            with counting_allreduce(counts):
                tloss = course_mlp.loss_fn(ddp(torch.from_numpy(Xw)), torch.from_numpy(yw))
                tloss.backward()
            course_mlp.sgd_step(module, config.lr)
            out["torch_s"].append(time.perf_counter() - t0)
            out["torch_payload"].append(sum(counts))
            out["torch_calls"].append(len(counts))
            out["torch_loss"].append(float(tloss))
            params_t = course_mlp.flat(module, mlp, layers)
            out["param"].append(np.abs(params_t - mlp.params).max() / np.abs(mlp.params).max())
        residuals = (None if not config.error_feedback else
                     (memory.residual, _bucket_residual(state, bucket_views, mlp.n_params)))
        with torch.no_grad():
            torch_predicted = module(torch.from_numpy(X)).argmax(1).numpy()
        correct = int((mlp.predict(X) == y).sum()), int((torch_predicted == y).sum())
        del ddp, state, tloss  # freed while the group lives (process_group collects garbage then)
    return out, residuals, correct


def powersgd_experiment(runner, config: PowerSGDConfig, data=None, *,
                        timeout: float | None = None) -> PowerSGDComparison:
    """Train with both on the first ``config.workers`` engines of ``runner`` (a
    ClusterRunner after ``setup_comm``: torch needs one process per rank). ``data``: an
    (X, y) pair (default: the digits training set)."""
    checks.instance(config, "config", PowerSGDConfig)
    X, y = digits_or(data)
    p = torch_ranks(runner, config.workers, "torch.distributed.algorithms.ddp_comm_hooks",
                    "torch.nn.parallel")
    ranks = runner.run(_rank_compare, config, X, y, ranks=p, timeout=timeout)
    outs = [o for o, _, _ in ranks]

    def per_step(key, reduce=np.max):
        return reduce(np.array([o[key] for o in outs], dtype=float), axis=0)

    if config.error_feedback:
        course_mean = np.mean([c for _, (c, _), _ in ranks], axis=0)
        torch_mean = np.mean([t for _, (_, t), _ in ranks], axis=0)
        scale = np.abs(course_mean).max()
        residual_error = float(np.abs(torch_mean - course_mean).max() / scale)
        worker_error = max(float(np.abs(t - c).max()) for _, (c, t), _ in ranks) / scale
    else:
        residual_error = worker_error = 0.0
    correct = ranks[0][2]
    return PowerSGDComparison(
        config=config, loss=per_step("loss", np.mean), torch_loss=per_step("torch_loss", np.mean),
        param_error=per_step("param"), residual_mean_error=residual_error,
        residual_worker_error=worker_error,
        course_payload=per_step("payload"), torch_payload=per_step("torch_payload"),
        torch_allreduces=per_step("torch_calls"),
        course_wire=np.array([o["wire"] for o in outs]).T,
        course_seconds=per_step("course_s"), torch_seconds=per_step("torch_s"),
        accuracy=correct[0] / len(X), torch_accuracy=correct[1] / len(X))
