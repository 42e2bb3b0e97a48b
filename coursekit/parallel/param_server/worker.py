"""A parameter-server worker's building blocks: data, compute, pull / push, timing, snapshots.

The loops that use them are in :mod:`.async_sgd` (SSP, ASP) and :mod:`.bsp` (BSP).
Worker ``i`` trains on its shard of the training rows (``coursekit.data.shard``); its
mini-batch at step t is drawn from ``np.random.default_rng([seed, i, t])``, so a given
(worker, step) always sees the same rows: a restarted run repeats no batch and skips none,
and BSP equals serial SGD on the concatenation of the workers' batches.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

from coursekit.cluster import live
from coursekit.comm import CommTimeout, PeerGone, ThreadComm
from coursekit.comm.trace import Trace, now
from coursekit.data import shard
from coursekit.nn import MLP
from coursekit.parallel.param_server.protocol import DONE, PULL, PUSH, recv_reply, send_request
from coursekit.parallel.param_server import results
from coursekit.parallel.param_server.results import SPAN_KINDS, WorkerReport
from coursekit.parallel.spans import Span


def batch_rows(seed: int, worker: int, step: int, n_rows: int, batch_size: int) -> np.ndarray:
    """The rows (indices into the worker's shard) of worker ``worker``'s batch at ``step``."""
    return np.random.default_rng([seed, worker, step]).integers(0, n_rows, batch_size)


class Crashed(Exception):
    """A simulated crash: the worker stops and falls silent (:mod:`coursekit.parallel.faults`)."""


class ShardSilent(Exception):
    """A shard sent no reply within ``config.timeout``, or its process ended: it is taken
    for dead (``shard``)."""

    def __init__(self, shard: int, message: str):
        super().__init__(message)
        self.shard = shard


class Worker:
    """Worker ``worker`` of ``config`` on ``topology`` (a
    :class:`~coursekit.parallel.param_server.protocol.PSTopology`): owns a model replica
    whose params are its weights."""

    def __init__(self, comm, config, topology, worker: int, data):
        self.comm, self.cfg, self.worker = comm, config, worker
        self.t0 = now()  # the caller resets it at the start barrier
        self.rank = topology.worker_ranks[worker]
        self.ranges = topology.ranges(config.n_params)
        self.mlp = MLP(config.sizes, dtype=config.dtype, seed=config.seed, device=config.device)
        X, y = shard(data.X_train, data.y_train, worker, topology.workers)
        self.X, self.y = self.mlp.check_batch(X, y)
        self.X_test, self.y_test = data.X_test, data.y_test
        self.grad = np.empty_like(self.mlp.params)
        self.versions = np.zeros(topology.servers, np.int64)
        self.applied = 0
        self.jitter = np.random.default_rng([config.seed, worker, 1 << 30])
        self.delay = float(config.straggler.get(worker, 0.0))
        self.crash_at = config.crash.get(worker)
        self.spans = Trace(maxlen=results.MAX_RECORDS)  # the newest spans: a long run stays flat
        self.totals = dict.fromkeys(SPAN_KINDS, 0.0)  # seconds per kind, over every span
        self.reporter = live.Reporter(interval=0.2, series=("t", "applied", "accuracy"),
                                      maxlen=results.MAX_CURVE_POINTS)
        self.next_snapshot = 0
        self.steps = 0
        self.error = ""
        # compile / load the kernels now, not inside the timed run
        self.mlp.loss_and_grad(self.X[:1], self.y[:1], out=self.grad, validate=False)

    @property
    def weights(self) -> np.ndarray:
        return self.mlp.params

    def elapsed(self) -> float:
        return now() - self.t0

    def _span(self, kind: str, start: float) -> None:
        span = Span(self.rank, kind, start, self.elapsed())
        self.spans.append(span)
        self.totals[kind] += span.duration

    # ---- compute ------------------------------------------------------------------------------
    def compute(self, step: int) -> np.ndarray:
        """The gradient at ``step`` on the current weights (plus any injected slowness)."""
        if step == self.crash_at:
            self.crash()
        start = self.elapsed()
        rows = batch_rows(self.cfg.seed, self.worker, step, len(self.X), self.cfg.batch_size)
        self.mlp.loss_and_grad(self.X[rows], self.y[rows], out=self.grad, validate=False)
        extra = self.delay + (self.jitter.exponential(self.cfg.jitter) if self.cfg.jitter else 0.0)
        if extra:
            time.sleep(extra)
        self._span("compute", start)
        self.steps += 1
        return self.grad

    def crash(self) -> None:
        """Die here: stop talking (simulated), or with ``crash_kills`` SIGKILL this engine."""
        if self.cfg.crash_kills and not isinstance(self.comm, ThreadComm):
            os.kill(os.getpid(), signal.SIGKILL)
        raise Crashed(f"worker {self.worker} crashed")

    # ---- talk to the shards -------------------------------------------------------------------
    def request_weights(self, clock: int) -> None:
        for server in range(len(self.ranges)):
            send_request(self.comm, server, PULL, self.rank, clock)

    def receive_weights(self) -> tuple[list[int], list[int]]:
        """Every shard's reply, written into the weights; returns (clocks, statuses)."""
        start, clocks, statuses = self.elapsed(), [], []
        for server, (lo, hi) in enumerate(self.ranges):
            try:
                version, applied, clock, status = recv_reply(self.comm, server,
                                                             self.weights[lo:hi])
            except CommTimeout as exc:
                gone = isinstance(exc, PeerGone)
                raise ShardSilent(server, (
                    f"worker {self.worker} (rank {self.rank}) waited"
                    f"{'' if gone else f' {self.cfg.timeout:g} s'} for shard {server} (rank "
                    f"{server}, parameters [{lo}, {hi})) after {self.steps} steps: "
                    f"{'its process has exited' if gone else 'no reply'}")) from None
            self.versions[server] = version
            clocks.append(clock)
            statuses.append(status)
            if server == 0:
                self.applied = applied
        self._span("idle", start)
        return clocks, statuses

    def pull(self, clock: int) -> tuple[list[int], list[int]]:
        self.request_weights(clock)
        return self.receive_weights()

    def push(self, grad: np.ndarray, clock: int, read_versions: np.ndarray, n_steps: int) -> None:
        start = self.elapsed()
        for server, (lo, hi) in enumerate(self.ranges):
            send_request(self.comm, server, PUSH, self.rank, clock, int(read_versions[server]),
                         n_steps, grad[lo:hi])
        self._span("send", start)

    def send_grad(self, grad: np.ndarray, tag: int) -> None:
        """BSP: the bare gradient slices, no request header (the shard knows who sends)."""
        start = self.elapsed()
        for server, (lo, hi) in enumerate(self.ranges):
            self.comm.send(grad[lo:hi], server, tag)
        self._span("send", start)

    def done(self, clock: int, skip: int | None = None) -> None:
        """Tell every shard (but ``skip``) this worker ends at ``clock``: before the last
        clock, it leaves the run (a shard fell silent)."""
        for server in range(len(self.ranges)):
            if server != skip:
                send_request(self.comm, server, DONE, self.rank, clock)

    def leave(self, silent: ShardSilent) -> WorkerReport:
        """Shard ``silent.shard`` is gone, and its range of the weights with it: tell the
        other shards this worker leaves and report the error."""
        self.done(self.steps, skip=silent.shard)
        self.error = str(silent)
        return self.report("server lost")

    # ---- record -------------------------------------------------------------------------------
    def snapshot(self, step: int) -> None:
        """If ``step`` reached the next snapshot: test accuracy of the weights just pulled,
        kept and published live (``coursekit.cluster.live``; ~0.1 ms for the digits test set)."""
        if step < self.next_snapshot:
            return
        self.next_snapshot = step + self.cfg.eval_every
        self.reporter.log(t=self.elapsed(), applied=self.applied,
                          accuracy=self.mlp.accuracy(self.X_test, self.y_test),
                          step=step, total=self.cfg.steps, idle=self.totals["idle"],
                          worker=self.worker)

    def report(self, status: str) -> WorkerReport:
        wall, total, curve = self.elapsed(), self.totals, self.reporter.record
        self.reporter.log(step=self.cfg.steps, status=status)
        self.reporter.close()
        return WorkerReport(self.worker, status, self.steps, wall, total["compute"], total["idle"],
                            total["send"], self.spans, np.array(curve["t"]),
                            np.array(curve["applied"], np.int64), np.array(curve["accuracy"]),
                            self.mlp.device_name, self.error)
