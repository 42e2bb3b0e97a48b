"""PSConfig: everything one parameter-server training run needs, checked once, up front."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from coursekit import checks
from coursekit.nn import layout
from coursekit.nn.mlp import check_device, check_dtype
from coursekit.parallel.param_server.consistency import MODELS
from coursekit.parallel.param_server.protocol import PSTopology

_SECONDS = " (seconds)"


@dataclass(frozen=True)
class PSConfig:
    """One run: consistency model, model, optimizer, faults. Its shape (how many server
    shards and workers) is not here: it is the :class:`~.protocol.PSTopology` that
    ``train(runner, config, data, workers=W, servers=S)`` builds, checked against this
    config by :meth:`check_topology`.

    model / staleness: "bsp", "ssp" (bound ``staleness`` = s >= 0) or "asp".
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
    server_delay: {shard: extra seconds that shard spends on each update it applies} (a slow
    server: a busy node, a slow link). Under BSP an iteration ends when the slowest shard has
    applied its update, so the pace is the undelayed iteration plus ``max_k delay_k``
    (:mod:`.pace`). server_crash: {shard: version}: that shard falls silent once its version
    reaches it (simulated, the engine lives on; 'ssp' and 'asp'). Its range of the weights
    exists nowhere else, so the run stops: every worker waits ``timeout`` for the shard's
    reply, tells the other shards it leaves, and :func:`~.async_sgd.train` raises
    :class:`~.results.ServerFailure` naming the shard.
    worker_timeout: a worker silent this long while the server waits for it is lost.
    timeout: how long any blocking receive waits before CommTimeout.
    checkpoint_every / checkpoint_dir: every shard saves its state each time its version
    is a multiple of checkpoint_every; resume: restart from the latest checkpoint there.
    eval_every: a worker snapshots the weights it pulled every eval_every steps.
    device: where each worker computes its gradients, "cpu", "cuda" or "auto" (the GPU
    when its engine has one; on a cluster engine i drives GPU local_rank % n_gpus): each
    worker builds its MLP with it. The shards stay on the host whatever it says: a server
    only adds gradients into its range and sends weights over the Comm, work the host does
    at memory speed, and its weights are what the Comm sends. Not in :meth:`fingerprint`:
    a run resumed on another device follows the same trajectory up to rounding.
    """

    model: str = "ssp"
    staleness: int = 0
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
    server_delay: dict = field(default_factory=dict)
    server_crash: dict = field(default_factory=dict)
    worker_timeout: float = 5.0
    timeout: float = 30.0
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    resume: bool = False
    eval_every: int = 10
    device: str = "cpu"

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r}: allowed {MODELS}")
        s = checks.integer(self.staleness, "staleness", at_least=0, hint=" (a bound on how many "
                           "clocks a worker may run ahead of the slowest; 0 is BSP)")
        if s and self.model != "ssp":
            raise ValueError(f"staleness={s} applies to model='ssp' only "
                             f"(got model={self.model!r})")
        object.__setattr__(self, "sizes", layout.check_sizes(self.sizes))
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
        layout.check_fits(self.sizes, check_dtype(self.dtype).itemsize)
        checks.integer(self.seed, "seed", at_least=0)
        check_device(self.device)
        worker_timeout = checks.real(self.worker_timeout, "worker_timeout", above=0, hint=_SECONDS)
        checks.real(self.timeout, "timeout", above=0, hint=_SECONDS)
        checks.real(self.jitter, "jitter", at_least=0, hint=_SECONDS)
        for w, delay in self._keyed("straggler").items():
            if checks.real(delay, f"straggler[{w}]", at_least=0, hint=_SECONDS) >= worker_timeout:
                raise ValueError(f"straggler[{w}]={delay} s per step would get worker {w} declared "
                                 f"lost (worker_timeout={worker_timeout} s); raise worker_timeout")
        for w, step in self._keyed("crash").items():
            checks.integer(step, f"crash[{w}]", at_least=0)
            if step >= self.steps:
                raise ValueError(f"crash[{w}]={step}: must be a step in 0..{self.steps - 1}")
        checks.boolean(self.crash_kills, "crash_kills")
        for k, delay in self._keyed("server_delay", "server shard").items():
            checks.real(delay, f"server_delay[{k}]", at_least=0, hint=_SECONDS)
        for k, version in self._keyed("server_crash", "server shard").items():
            checks.integer(version, f"server_crash[{k}]", at_least=0, hint=" (a shard version)")
        if self.server_crash:
            if self.model == "bsp":
                raise ValueError("server_crash applies to 'ssp' and 'asp' (BSP's shards wait for "
                                 "every worker in lockstep: a dead shard stops BSP as a dead "
                                 "worker does)")
            if self.model == "ssp" and self.timeout <= worker_timeout:
                raise ValueError(f"server_crash with model='ssp' needs timeout > worker_timeout "
                                 f"(got {self.timeout} <= {worker_timeout}): the clock gate may "
                                 "hold a pull until the slowest worker is declared lost, and a "
                                 "shard silent for `timeout` is taken for dead")
        checks.boolean(self.resume, "resume")
        checks.path(self.checkpoint_dir, "checkpoint_dir", optional=True)
        if checks.integer(self.checkpoint_every, "checkpoint_every", at_least=0) or self.resume:
            if not self.checkpoint_dir:
                raise ValueError("checkpoint_every > 0 and resume=True need a checkpoint_dir")

    def _keyed(self, name: str, what: str = "worker") -> dict:
        """``{index: value}`` of ``name``, an index of a ``what`` ("worker" or "server shard"):
        the keys are checked here for their type only; which exist is the topology's
        (:meth:`check_topology`)."""
        spec = getattr(self, name)
        if not isinstance(spec, dict):
            raise TypeError(f"{name} must be a dict {{{what} index: value}}, got {spec!r}")
        for k in spec:
            checks.integer(k, f"{name} key", at_least=0, hint=f" (a {what} index)")
        return spec

    def check_topology(self, topology: PSTopology) -> PSTopology:
        """``topology`` if this run fits it; ValueError if a straggler or crash names a worker
        (a server_delay or server_crash a shard) it does not have, or it has more server
        shards than parameters."""
        checks.instance(topology, "topology", PSTopology)
        topology.ranges(self.n_params)  # ValueError for more shards than parameters
        for name in ("straggler", "crash"):
            for w in getattr(self, name):
                if w >= topology.workers:
                    raise ValueError(f"{name} names worker {w!r}; workers are "
                                     f"0..{topology.workers - 1}")
        for name in ("server_delay", "server_crash"):
            for k in getattr(self, name):
                if k >= topology.servers:
                    raise ValueError(f"{name} names shard {k!r}; server shards are "
                                     f"0..{topology.servers - 1}")
        return topology

    def fingerprint(self, topology: PSTopology, data: str) -> dict:
        """Which run this is, as a shard's checkpoint records it: the settings that fix the
        trajectory (consistency model and staleness, optimizer, model, batches, warm-up,
        Downpour's n_fetch / n_push), the topology and the training data's digest ``data``
        (:func:`coursekit.datafile.digest`). A checkpoint that records another is not
        resumed (:mod:`coursekit.parallel.checkpoint`). Left out, since a restarted run may
        change them: ``steps`` (a run may be extended), faults and delays, timeouts,
        checkpointing and evaluation."""
        keep = ("model", "staleness", "batch_size", "lr", "momentum", "n_fetch", "n_push",
                "warmup", "sizes", "dtype", "seed")
        return {"servers": topology.servers, "workers": topology.workers,
                **{k: getattr(self, k) for k in keep}, "data": data}

    @property
    def n_params(self) -> int:
        return layout.n_params(self.sizes)

    def initial_params(self) -> np.ndarray:
        """The flat initial weights every shard slices its range from (MLP(sizes, seed))."""
        from coursekit.nn import MLP
        return MLP(self.sizes, dtype=self.dtype, seed=self.seed).params
