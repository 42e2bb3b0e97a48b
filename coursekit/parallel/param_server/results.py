"""What a parameter-server run returns: one report per shard and per worker, and their union.

Times are seconds since the run's start barrier (every rank takes its own start right after
it, so the ranks' clocks line up to a message latency).

Per-step records are bounded, so that a long run holds flat memory and a constant step time
(issue 29: unbounded span lists grew ~1.2 KB per step, and summing them at every snapshot
made each step slower than the last): every list of records (a worker's spans; a shard's
staleness, from_worker and update_t) keeps the newest :data:`MAX_RECORDS` as a bounded
:class:`~coursekit.comm.trace.Trace` (``.dropped`` counts the older ones), while what the
chapter prints is summed over every step as the run goes: a worker's compute / idle / send
seconds and a shard's staleness histogram (``staleness_counts``). A run shorter than the
bound keeps every record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from coursekit.parallel.param_server.config import PSConfig
from coursekit.parallel.param_server.protocol import PSTopology

MAX_RECORDS = 30_000
"""How many records each per-step list keeps (the newest): ~10k steps of a worker's spans
(three a step, ~130 bytes each: ~4 MB), 30k applied gradients of a shard. Read when a
worker or a shard is built; set it before a run (threads) to change it."""

MAX_CURVE_POINTS = 1_000
"""How many accuracy snapshots a worker's curve keeps (``curve_*``; the live plot's too)."""

SPAN_KINDS = ("compute", "idle", "send")


@dataclass
class ServerReport:
    """One shard: its final weights and the updates it applied.

    ``staleness[j]`` is the staleness of the j-th gradient applied (shard version when applied
    minus the version it was computed on) and ``from_worker[j]`` the worker it came from;
    ``update_t[v]`` is when version v + 1 was reached. All three keep the newest
    :data:`MAX_RECORDS` (every one in a shorter run): ``dropped`` gradients and
    ``updates_dropped`` versions came before them. ``staleness_counts`` is
    ``{staleness: gradients}`` over every gradient applied, dropped ones included. ``lost``
    holds ``(worker, t, clock)`` for every worker this shard declared lost.
    """

    shard: int
    lo: int
    hi: int
    params: np.ndarray
    version: int
    applied: int
    staleness: np.ndarray
    from_worker: np.ndarray
    update_t: np.ndarray
    errors: list = field(default_factory=list)
    lost: list = field(default_factory=list)
    checkpoints: list = field(default_factory=list)
    staleness_counts: dict = field(default_factory=dict)
    dropped: int = 0
    updates_dropped: int = 0


@dataclass
class WorkerReport:
    """One worker: how its time went, and test accuracy of the weights it pulled.

    ``status``: "finished", "evicted" (a shard had declared it lost), "crashed" (a
    simulated crash; a killed process returns no report at all) or "server lost" (a shard
    fell silent: ``error`` says which and how long the worker waited).
    ``compute_s``, ``idle_s``, ``send_s``: seconds spent in each, over the whole run.
    ``spans``: the newest :data:`MAX_RECORDS` :class:`~coursekit.parallel.spans.Span` s on
    the worker's rank (a :class:`~coursekit.comm.trace.Trace`: ``spans.dropped`` older ones
    are gone), in seconds from the start, with kind "compute", "idle" (waiting for weights)
    or "send" (pushing), for a per-worker timeline. ``curve_*``: at each snapshot, the time,
    the gradients the weights contained (shard 0's ``applied``) and their test accuracy
    (at most :data:`MAX_CURVE_POINTS`: a longer run keeps every other one, see
    :class:`coursekit.cluster.live.Reporter`). ``device``: where it computed its gradients,
    "cpu" or "cuda:<id>" (:attr:`coursekit.nn.MLP.device_name`; the shards are on the host).
    """

    worker: int
    status: str
    steps: int
    wall_s: float
    compute_s: float
    idle_s: float
    send_s: float
    spans: list
    curve_t: np.ndarray
    curve_applied: np.ndarray
    curve_accuracy: np.ndarray
    device: str = "cpu"
    error: str = ""

    @property
    def throughput(self) -> float:
        """Iterations per second of wall-clock time."""
        return self.steps / self.wall_s if self.wall_s > 0 else float("nan")


class ServerFailure(RuntimeError):
    """A server shard failed, so the run stopped: its range of the weights exists nowhere else.

    ``shards``: the failed shards' indices (their ranks are the same numbers); the message
    names each with its parameter range and what the workers saw (how long they waited).
    """

    def __init__(self, topology: PSTopology, n_params: int, servers: list, workers: list):
        ranges = topology.ranges(n_params)
        self.shards = [k for k, s in enumerate(servers) if s is None]
        lines = [f"server shard {k} (rank {k}, parameters [{ranges[k][0]}, {ranges[k][1]})) "
                 "failed: its part of the weights exists nowhere else, so training stopped"
                 for k in self.shards]
        lines += [f"  {w.error}" for w in workers if w is not None and w.error]
        lines += [f"  shard {s.shard} stopped at version {s.version}" for s in servers
                  if s is not None]
        super().__init__("\n".join(lines))


@dataclass
class PSResult:
    """A whole run of ``config`` on ``topology`` (its servers and workers): ``params`` (the
    shards' weights, concatenated), reports, and summaries."""

    config: PSConfig
    topology: PSTopology
    params: np.ndarray
    servers: list
    workers: list  # WorkerReport, or None for a worker whose process died

    @property
    def staleness(self) -> np.ndarray:
        """Staleness of every applied gradient on every shard (of the newest
        :data:`MAX_RECORDS` per shard in a longer run: :meth:`staleness_histogram` counts
        them all)."""
        return np.concatenate([s.staleness for s in self.servers])

    def staleness_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """``(values, counts)`` of the staleness of every gradient applied on every shard,
        however long the run: ``np.unique(result.staleness, return_counts=True)`` when no
        record was dropped."""
        total: dict[int, int] = {}
        for s in self.servers:
            for value, count in s.staleness_counts.items():
                total[value] = total.get(value, 0) + count
        values = np.array(sorted(total), np.int64)
        return values, np.array([total[v] for v in values.tolist()], np.int64)

    @property
    def applied(self) -> int:
        """Mini-batch gradients in the final weights (shard 0's count)."""
        return self.servers[0].applied

    @property
    def lost(self) -> list[dict]:
        """Lost workers: ``{"worker", "t", "clock"}`` as first noticed by any shard."""
        first: dict[int, tuple] = {}
        for s in self.servers:
            for w, t, clock in s.lost:
                if w not in first or t < first[w][0]:
                    first[w] = (t, clock)
        return [{"worker": w, "t": t, "clock": c} for w, (t, c) in sorted(first.items())]

    @property
    def errors(self) -> list[str]:
        return [e for s in self.servers for e in s.errors]

    def _per_worker(self, attr: str) -> np.ndarray:
        return np.array([getattr(w, attr) if w is not None else np.nan for w in self.workers])

    @property
    def devices(self) -> list:
        """Where each worker computed, "cpu" or "cuda:<id>" (None: its process was lost)."""
        return [w.device if w is not None else None for w in self.workers]

    @property
    def idle_s(self) -> np.ndarray:
        """Seconds each worker spent waiting for weights (NaN: process lost)."""
        return self._per_worker("idle_s")

    @property
    def throughput(self) -> np.ndarray:
        """Iterations per second of each worker (NaN: process lost)."""
        return self._per_worker("throughput")

    @property
    def wall_s(self) -> float:
        """Seconds from the start to the last worker's end or the last update."""
        ends = [w.wall_s for w in self.workers if w is not None]
        ends += [s.update_t[-1] for s in self.servers if len(s.update_t)]
        return max(ends, default=0.0)

    def curve(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(t, applied, accuracy)`` of every worker's snapshots, in time order."""
        reports = [w for w in self.workers if w is not None]
        t, applied, acc = (np.concatenate([getattr(w, f"curve_{k}") for w in reports])
                           for k in ("t", "applied", "accuracy"))
        order = np.argsort(t, kind="stable")
        return t[order], applied[order], acc[order]

    def accuracy(self, X, y) -> float:
        """Accuracy of the final weights on (X, y)."""
        from coursekit.nn import MLP
        mlp = MLP(self.config.sizes, dtype=self.config.dtype)
        mlp.params[...] = self.params
        return mlp.accuracy(X, y)

    def summary(self) -> str:
        c = self.config
        model = f"SSP s={c.staleness}" if c.model == "ssp" else c.model.upper()
        values, counts = self.staleness_histogram()
        mean = values @ counts / counts.sum() if len(counts) else 0
        lines = [f"{model}: {self.topology.workers} workers, {self.topology.servers} shard(s), "
                 f"{self.applied} gradients applied in {self.wall_s:.2f} s; staleness max {values.max(initial=0)}, "
                 f"mean {mean:.2f}"]
        lines += [f"worker {d['worker']} lost at t = {d['t']:.2f} s (clock {d['clock']})"
                  for d in self.lost]
        lines += [f"error: {e}" for e in self.errors]
        return "\n".join(lines)
