"""PSConfig: everything one parameter-server training run needs, checked once, up front."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from coursekit import checks
from coursekit.nn import layout
from coursekit.nn.mlp import check_dtype
from coursekit.parallel.param_server.consistency import MODELS
from coursekit.parallel.param_server.protocol import shard_ranges

_SECONDS = " (seconds)"


@dataclass(frozen=True)
class PSConfig:
    """One run: consistency model, cluster shape, model, optimizer, faults.

    model / staleness: "bsp", "ssp" (bound ``staleness`` = s >= 0) or "asp".
    n_servers / n_workers: shards on ranks 0..S-1, workers on ranks S..S+W-1.
    steps: iterations per worker (its final clock); batch_size: rows per mini-batch.
    lr / momentum: the update rule applied on the shards (SGD, or momentum when > 0).
    n_fetch / n_push (ASP): fetch weights every n_fetch steps, push the summed gradient
    every n_push steps; between fetches the worker also steps its own copy (Downpour).
    warmup: synchronous iterations before SSP / ASP start.
    straggler: {worker: extra seconds per step}; jitter: mean of an exponential extra delay
    every worker draws per step (seeded), the transient slowness SSP absorbs.
    crash: {worker: step}: that worker crashes at that step: it stops and never talks to the
    shards again (simulated, the engine lives on: :mod:`coursekit.parallel.faults`);
    crash_kills=True SIGKILLs the worker's engine process instead (a cluster you started).
    worker_timeout: a worker silent this long while the server waits for it is lost.
    timeout: how long any blocking receive waits before CommTimeout.
    checkpoint_every / checkpoint_dir: every shard saves its state each time its version
    is a multiple of checkpoint_every; resume: restart from the latest checkpoint there.
    eval_every: a worker snapshots the weights it pulled every eval_every steps.
    """

    model: str = "ssp"
    staleness: int = 0
    n_servers: int = 1
    n_workers: int = 3
    steps: int = 100
    batch_size: int = 32
    lr: float = 0.1
    momentum: float = 0.0
    n_fetch: int = 1
    n_push: int = 1
    warmup: int = 0
    sizes: tuple = (64, 32, 10)
    dtype: str = "float32"
    seed: int = 0
    straggler: dict = field(default_factory=dict)
    jitter: float = 0.0
    crash: dict = field(default_factory=dict)
    crash_kills: bool = False
    worker_timeout: float = 5.0
    timeout: float = 30.0
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    resume: bool = False
    eval_every: int = 10

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r}: allowed {MODELS}")
        s = checks.integer(self.staleness, "staleness", at_least=0, hint=" (a bound on how many "
                           "clocks a worker may run ahead of the slowest; 0 is BSP)")
        if s and self.model != "ssp":
            raise ValueError(f"staleness={s} applies to model='ssp' only "
                             f"(got model={self.model!r})")
        checks.integer(self.n_workers, "n_workers", at_least=1,
                       hint=" (a parameter server needs at least one worker)")
        object.__setattr__(self, "sizes", layout.check_sizes(self.sizes))
        checks.integer(self.n_servers, "n_servers", hint=" (shards, at least one)")
        shard_ranges(self.n_params, self.n_servers)  # ValueError for more shards than params
        for name in ("steps", "batch_size", "n_fetch", "n_push", "eval_every"):
            checks.integer(getattr(self, name), name, at_least=1)
        if self.model != "asp" and (self.n_fetch, self.n_push) != (1, 1):
            raise ValueError("n_fetch and n_push apply to model='asp' only (Downpour); "
                             f"model={self.model!r} fetches and pushes every step")
        if checks.integer(self.warmup, "warmup", at_least=0) > self.steps:
            raise ValueError(f"warmup={self.warmup} exceeds steps={self.steps}")
        if self.model == "bsp" and self.warmup:
            raise ValueError("warmup applies to 'ssp' and 'asp'; BSP is synchronous throughout")
        checks.real(self.lr, "lr", above=0)
        checks.real(self.momentum, "momentum", at_least=0, below=1)
        check_dtype(self.dtype)
        checks.integer(self.seed, "seed", at_least=0)
        worker_timeout = checks.real(self.worker_timeout, "worker_timeout", above=0, hint=_SECONDS)
        checks.real(self.timeout, "timeout", above=0, hint=_SECONDS)
        checks.real(self.jitter, "jitter", at_least=0, hint=_SECONDS)
        for w, delay in self._per_worker("straggler").items():
            if checks.real(delay, f"straggler[{w}]", at_least=0, hint=_SECONDS) >= worker_timeout:
                raise ValueError(f"straggler[{w}]={delay} s per step would get worker {w} declared "
                                 f"lost (worker_timeout={worker_timeout} s); raise worker_timeout")
        for w, step in self._per_worker("crash").items():
            checks.integer(step, f"crash[{w}]", at_least=0)
            if step >= self.steps:
                raise ValueError(f"crash[{w}]={step}: must be a step in 0..{self.steps - 1}")
        checks.boolean(self.crash_kills, "crash_kills")
        checks.boolean(self.resume, "resume")
        if checks.integer(self.checkpoint_every, "checkpoint_every", at_least=0) or self.resume:
            if not self.checkpoint_dir:
                raise ValueError("checkpoint_every > 0 and resume=True need a checkpoint_dir")

    def _per_worker(self, name: str) -> dict:
        spec = getattr(self, name)
        if not isinstance(spec, dict):
            raise TypeError(f"{name} must be a dict {{worker index: value}}, got {spec!r}")
        for w in spec:
            if isinstance(w, bool) or not isinstance(w, numbers.Integral) \
                    or not 0 <= w < self.n_workers:
                raise ValueError(f"{name} names worker {w!r}; workers are 0..{self.n_workers - 1}")
        return spec

    @property
    def n_params(self) -> int:
        return layout.n_params(self.sizes)

    @property
    def n_ranks(self) -> int:
        return self.n_servers + self.n_workers

    @property
    def ranges(self) -> list[tuple[int, int]]:
        return shard_ranges(self.n_params, self.n_servers)

    @property
    def worker_ranks(self) -> range:
        return range(self.n_servers, self.n_ranks)

    def check_size(self, size: int) -> None:
        """ValueError unless a comm of ``size`` ranks can host this run."""
        if size < self.n_ranks:
            raise ValueError(f"this run needs {self.n_servers} server(s) + {self.n_workers} "
                             f"worker(s) = {self.n_ranks} ranks, but the comm has {size}")

    def initial_params(self) -> np.ndarray:
        """The flat initial weights every shard slices its range from (MLP(sizes, seed))."""
        from coursekit.nn import MLP
        return MLP(self.sizes, dtype=self.dtype, seed=self.seed).params
