"""The settings of one synchronous data-parallel run, checked before anything starts.

One frozen dataclass travels from the notebook to every engine, so all workers agree on
every setting. Each field is checked here with an error that says what is allowed; the
checks that need the number of workers N are in :meth:`DPConfig.check_workers`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from coursekit import checks
from coursekit.collectives import ALGORITHMS
from coursekit.nn import activations
from coursekit.nn.layout import check_fits, check_sizes
from coursekit.nn.mlp import LOSSES, check_device, check_dtype

from .lr_rules import check_rule

__all__ = ["EXCHANGES", "DPConfig"]

EXCHANGES = ("allreduce", "ps", "average")
"""allreduce: sum the gradients with an allreduce; ps: reduce them to a parameter server
(rank 0), which steps and broadcasts the parameters; average: local SGD, every worker
steps on its own gradient and the parameters are averaged every ``average_every`` steps."""


@dataclass(frozen=True)
class DPConfig:
    """Synchronous data-parallel SGD on an MLP (see :mod:`.sync_sgd`).

    Model: ``sizes``, ``activation``, ``loss``, ``dtype``; initial weights from ``seed``.
    Data: ``batch_size`` is the GLOBAL batch B = n * N, split over the N workers; the rows
    are shuffled every epoch exactly like :func:`coursekit.nn.train` with the same seed.
    ``epochs`` full passes, or ``max_steps`` steps if given (whichever ends first).
    Optimizer: ``lr`` (tuned for one worker), scaled by ``lr_rule`` with N
    (:mod:`.lr_rules`; ``warmup_steps`` for "linear_warmup"), ``momentum``.
    Exchange: ``exchange`` in :data:`EXCHANGES`; ``algorithm`` for allreduce (any of
    chapter 2's); ``average_every`` = k for local SGD; ``bucket_bytes`` splits the gradient
    into buckets of that many bytes (allreduce only; None = one piece) that are reduced
    while the backward pass still runs when ``overlap``. ``backward``: "fused" (one Numba
    call for the whole forward + backward, the fastest on the CPU) or "layers" (NumPy,
    layer by layer, :mod:`coursekit.nn.reference`); the overlapped backward always runs
    layer by layer, so a fair timing of overlap against no overlap uses "layers" for both.
    Device: ``device`` where every worker computes its gradient: "cpu", "cuda" (each
    engine the GPU of its local rank) or "auto" (the GPU where numba finds one). On a GPU a
    step is t_compute + t_stage + t_comm, t_stage the host <-> device copies (the flat
    buffer stays on the host, where it is exchanged); the overlapped backward
    (``bucket_bytes`` with ``overlap``) runs layer by layer in NumPy on the host, so it
    refuses "cuda" and computes on the CPU with "auto" (:attr:`worker_device`).
    Faults: ``straggler_rank`` computes ``slow_factor`` times slower; ``crash_rank``
    dies at the start of step ``crash_step``.
    Checkpoints: every ``checkpoint_every`` steps into ``checkpoint_dir``.
    Reporting: test accuracy every ``eval_every`` steps (0: at the end only), spans and
    messages of the last ``timeline_steps`` steps, live updates every ``publish_interval`` s.
    """

    sizes: tuple = (64, 32, 10)
    activation: str = "relu"
    loss: str = "softmax_xent"
    dtype: str = "float32"
    seed: int = 0
    batch_size: int = 64
    epochs: int = 1
    max_steps: int | None = None
    lr: float = 0.05
    lr_rule: str = "constant"
    warmup_steps: int = 0
    momentum: float = 0.0
    exchange: str = "allreduce"
    algorithm: str = "ring"
    average_every: int = 1
    bucket_bytes: int | None = None
    overlap: bool = True
    backward: str = "fused"
    device: str = "cpu"
    straggler_rank: int | None = None
    slow_factor: float = 1.0
    crash_rank: int | None = None
    crash_step: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    eval_every: int = 0
    timeline_steps: int = 3
    publish_interval: float = 0.2

    def __post_init__(self):
        object.__setattr__(self, "sizes", check_sizes(self.sizes))
        object.__setattr__(self, "dtype", check_dtype(self.dtype).name)
        check_fits(self.sizes, check_dtype(self.dtype).itemsize)
        activations.activation_code(self.activation, "activation",
                                    activations.HIDDEN_ACTIVATIONS)
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r} is not supported; allowed: {', '.join(LOSSES)}")
        checks.integer(self.seed, "seed", at_least=0)
        checks.integer(self.batch_size, "batch_size", at_least=1,
                       hint=" (the global batch, split over the workers)")
        checks.integer(self.epochs, "epochs", at_least=1)
        if self.max_steps is not None:
            checks.integer(self.max_steps, "max_steps", at_least=1, hint=" or None")
        checks.real(self.lr, "lr", above=0)
        check_rule(self.lr_rule)
        checks.integer(self.warmup_steps, "warmup_steps", at_least=0)
        checks.real(self.momentum, "momentum", at_least=0, below=1)
        if self.exchange not in EXCHANGES:
            raise ValueError(f"unknown exchange {self.exchange!r}; allowed: {', '.join(EXCHANGES)}")
        if self.algorithm not in ALGORITHMS["allreduce"]:
            raise ValueError(f"unknown allreduce algorithm {self.algorithm!r}; allowed: "
                             f"{', '.join(ALGORITHMS['allreduce'])}")
        checks.integer(self.average_every, "average_every", at_least=1)
        if self.bucket_bytes is not None:
            checks.integer(self.bucket_bytes, "bucket_bytes", at_least=1,
                           hint=" (bytes per gradient bucket; None = one piece)")
            if self.exchange != "allreduce":
                raise ValueError(f"bucket_bytes applies to exchange='allreduce' only (got "
                                 f"exchange={self.exchange!r}); use bucket_bytes=None")
        checks.boolean(self.overlap, "overlap")
        if self.backward not in ("fused", "layers"):
            raise ValueError(f"backward={self.backward!r}: allowed 'fused' (one Numba call) or "
                             "'layers' (NumPy, layer by layer, as the overlapped backward)")
        if self.device == "cuda" and self.backward == "layers":
            raise ValueError("backward='layers' runs in NumPy on the host; use device='cpu' or "
                             "'auto', or backward='fused' on the GPU")
        check_device(self.device)
        if self.device == "cuda" and self.overlapping:
            raise ValueError("device='cuda' cannot overlap buckets with the backward pass: the "
                             "overlapped backward runs layer by layer in NumPy on the host; use "
                             "overlap=False (buckets reduced after the fused GPU backward), "
                             "bucket_bytes=None, or device='cpu'")
        checks.real(self.slow_factor, "slow_factor", at_least=1)
        if (self.crash_rank is None) != (self.crash_step is None):
            raise ValueError("give both crash_rank and crash_step, or neither")
        for name in ("straggler_rank", "crash_rank", "crash_step"):
            if getattr(self, name) is not None:
                checks.integer(getattr(self, name), name, at_least=0, hint=" or None")
        checks.integer(self.checkpoint_every, "checkpoint_every", at_least=0)
        checks.path(self.checkpoint_dir, "checkpoint_dir", optional=True)
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ValueError("checkpoint_every > 0 needs a checkpoint_dir")
        checks.integer(self.eval_every, "eval_every", at_least=0)
        checks.integer(self.timeline_steps, "timeline_steps", at_least=0)
        checks.real(self.publish_interval, "publish_interval", at_least=0)

    @property
    def overlapping(self) -> bool:
        """Whether buckets are reduced while the backward pass runs (bucket_bytes and overlap)."""
        return self.bucket_bytes is not None and self.overlap

    @property
    def worker_device(self) -> str:
        """The device each worker's MLP is built with: ``device``, except "cpu" for the
        overlapped backward (host NumPy, layer by layer), where "auto" computes on the CPU."""
        return "cpu" if self.overlapping or self.backward == "layers" else self.device

    def check_workers(self, n_workers) -> int:
        """N itself; ValueError when this run cannot use N workers."""
        checks.integer(n_workers, "n_workers", at_least=1, hint=" (the number of workers)")
        if self.batch_size < n_workers:
            raise ValueError(f"batch_size={self.batch_size} is smaller than the number of "
                             f"workers ({n_workers}): every worker needs at least one example "
                             f"per step; use batch_size >= {n_workers} or fewer workers")
        for name in ("straggler_rank", "crash_rank"):
            rank = getattr(self, name)
            if rank is not None and not 0 <= rank < n_workers:
                raise ValueError(f"{name}={rank!r} is not a worker: allowed 0..{n_workers - 1}")
        return int(n_workers)

    def total_steps(self, n_rows: int) -> int:
        """Steps of the run: epochs * ceil(n_rows / B), capped at max_steps."""
        steps = self.epochs * -(-n_rows // self.batch_size)
        return steps if self.max_steps is None else min(steps, self.max_steps)

    def fingerprint(self, n_workers: int, data: str) -> dict:
        """Which run this is, as a checkpoint records it: the settings that fix the
        trajectory, the number of workers and the training data's digest ``data``
        (:func:`coursekit.datafile.digest`). A checkpoint that records another is not
        resumed (:mod:`coursekit.parallel.checkpoint`). Left out, since a resumed run may
        change them: the length (epochs, max_steps), faults, checkpointing, reporting, and
        how the sum is computed (algorithm, buckets, overlap: the same sum, rounded in
        another order), and where it is computed (device: the same model, so a checkpoint
        of a CPU run resumes on GPUs and back)."""
        keep = {k: v for k, v in asdict(self).items()
                if k in ("sizes", "activation", "loss", "dtype", "seed", "batch_size", "lr",
                         "lr_rule", "warmup_steps", "momentum", "exchange", "average_every")}
        return {"workers": int(n_workers), **keep, "data": data}
