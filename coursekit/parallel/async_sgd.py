"""Asynchronous SGD on a sharded parameter server: SSP and ASP (Downpour) workers, and runners.

The SSP / ASP worker at step t (``sync`` = SSP or a warm-up step):

* pull: ask every shard for its weights (SSP: the shard answers only when
  ``t - min_clock <= s``; ASP: every ``n_fetch`` steps, at once);
* compute ``g = dC/dw`` on its next mini-batch;
* sync: push ``g`` with clock t + 1 and the versions it was computed on;
* ASP: ``w <- w - lr g`` on its own copy (Downpour), add ``g`` to the accrued gradient and
  push that every ``n_push`` steps (and at the end).

:func:`train_ps` is the SPMD entry every rank calls with its Comm (shards on ranks 0..S-1,
workers on S..S+W-1; BSP runs the lockstep loops of :mod:`.ps_bsp`). :func:`train_local`
runs it on ThreadComm ranks, :func:`train_on_cluster` on the engines of a live cluster;
both return a :class:`~coursekit.parallel.ps_results.PSResult`, and both can stream the
workers' progress while they run (:func:`start_local` / :class:`EngineRuns` + :func:`follow`,
built on :mod:`coursekit.live`).

    >>> from coursekit.parallel.async_sgd import PSConfig, train_local
    >>> r = train_local(PSConfig(model="ssp", staleness=2, n_workers=3, steps=40))
    >>> int(r.staleness.max()) <= 2
    True
"""

from __future__ import annotations

import numpy as np

from coursekit import live
from coursekit.comm import reset_comm
from coursekit.comm.trace import now
from coursekit.parallel.faults import check_may_kill
from coursekit.parallel.param_server import ShardServer, serve
from coursekit.parallel.ps_bsp import bsp_serve, bsp_work
from coursekit.parallel.ps_config import PSConfig
from coursekit.parallel.ps_consistency import combined_push, ssp_gate
from coursekit.parallel.ps_protocol import EVICTED, HELLO
from coursekit.parallel.ps_results import PSResult, WorkerReport
from coursekit.parallel.ps_worker import Crashed, Worker

__all__ = ["EngineRuns", "PSConfig", "PSResult", "async_work", "collect", "follow", "start_local",
           "train_local", "train_on_cluster", "train_ps"]


def async_work(me: Worker) -> WorkerReport:
    """The SSP / ASP worker loop (module docstring) from the clock the shards report."""
    cfg = me.cfg
    try:
        clocks, statuses = me.pull(HELLO)
        start = min(clocks)
        read = me.versions.copy()
        accrued, n_accrued = np.zeros_like(me.weights), 0
        lr = me.weights.dtype.type(cfg.lr)
        for t in range(start, cfg.steps):
            sync = combined_push(cfg.model, cfg.warmup, t + 1)
            if t > start and (sync or (t - cfg.warmup) % cfg.n_fetch == 0):
                _, statuses = me.pull(t)
            if EVICTED in statuses:
                return me.report("evicted")
            me.snapshot(t)
            grad = me.compute(t)
            if sync:
                me.push(grad, t + 1, me.versions, 1)
                continue
            if n_accrued == 0:
                read = me.versions.copy()  # the oldest weights this accrued gradient saw
            accrued += grad
            n_accrued += 1
            me.weights[...] -= lr * grad
            if (t + 1 - cfg.warmup) % cfg.n_push == 0 or t + 1 == cfg.steps:
                me.push(accrued, t + 1, read, n_accrued)
                accrued[...], n_accrued = 0, 0
        me.done(cfg.steps)
        return me.report("finished")
    except Crashed:
        return me.report("crashed")


def train_ps(comm, config: PSConfig, data=None, gate=ssp_gate):
    """Every rank's part of one run: a ServerReport, a WorkerReport, or None (spare rank).

    ``data``: a :class:`coursekit.data.Dataset` (default: ``load_digits()``). ``gate``:
    the SSP clock gate the shards use (the exercise swaps in the student's).
    """
    if not isinstance(config, PSConfig):
        raise TypeError(f"config must be a PSConfig, got {type(config).__name__}")
    config.check_size(comm.size)
    S, rank = config.n_servers, comm.rank
    role = None
    if rank < S:
        role = ShardServer(comm, config, rank, gate)
    elif rank < config.n_ranks:
        if data is None:
            from coursekit.data import load_digits
            data = load_digits()
        role = Worker(comm, config, rank - S, data)
    saved = comm.timeout
    comm.timeout = config.timeout
    try:
        comm.barrier()  # everyone built its state (and compiled its kernels): start the clocks
        if role is None:
            return None
        role.t0 = now()
        bsp = config.model == "bsp"
        if rank < S:
            return bsp_serve(role) if bsp else serve(role)
        return bsp_work(role) if bsp else async_work(role)
    finally:
        comm.timeout = saved


def collect(config: PSConfig, outputs: list) -> PSResult:
    """The PSResult of the ranks' outputs (None for a worker whose process died)."""
    servers = outputs[:config.n_servers]
    if any(s is None for s in servers):
        raise RuntimeError("a server shard returned no report; the run's weights are lost")
    return PSResult(config, np.concatenate([s.params for s in servers]), servers,
                    list(outputs[config.n_servers:config.n_ranks]))


def start_local(config: PSConfig, data=None, gate=ssp_gate) -> live.LocalRun:
    """Start ``config`` on ``config.n_ranks`` ThreadComm ranks in the background."""
    if data is None:
        from coursekit.data import load_digits
        data = load_digits()
    return live.start_local(train_ps, config.n_ranks, config, data, gate, timeout=config.timeout)


class EngineRuns:
    """One AsyncResult per engine, seen as one run (what :func:`coursekit.live.follow` polls).

    Unlike a single multi-engine AsyncResult, :meth:`get` survives a worker engine that
    died: its output is None (its shards report it lost).
    """

    def __init__(self, cluster, config: PSConfig):
        config.check_size(cluster.size)
        self.config = config
        self.results = [cluster.client[eid].apply_async(_on_engine, config)
                        for eid in cluster.engine_ids]

    @property
    def data(self) -> list[dict]:
        return [ar.data for ar in self.results]

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else now() + timeout
        for ar in self.results:
            ar.wait(None if deadline is None else max(deadline - now(), 0))
        return all(ar.ready() for ar in self.results)

    def get(self, timeout: float | None = None) -> list:
        import ipyparallel as ipp

        from coursekit.cluster import EngineError

        if not self.wait(timeout):
            raise TimeoutError(f"the run did not finish within {timeout} s; "
                               "interrupt the engines with cluster.interrupt()")
        outputs = []
        for rank, ar in enumerate(self.results):
            try:
                outputs.append(ar.get())
            except ipp.error.RemoteError as err:
                if err.ename != "EngineError" or rank not in self.config.worker_ranks:
                    raise EngineError(f"train_ps failed on rank {rank}: {err.ename}: "
                                      f"{err.evalue}") from None
                outputs.append(None)  # its process died: the shards say when
        return outputs


def _on_engine(config: PSConfig):
    from coursekit.comm import engine_comm
    return train_ps(engine_comm(), config)


def follow(run, config: PSConfig, on_update=None, timeout: float = 120.0) -> PSResult:
    """Wait for ``run`` (from :func:`start_local` or :class:`EngineRuns`), calling
    ``on_update(data)`` with the workers' live progress; return the PSResult."""
    return collect(config, live.follow(run, on_update, progress=False, timeout=timeout))


def train_local(config: PSConfig, data=None, gate=ssp_gate) -> PSResult:
    """Run ``config`` on ThreadComm ranks in this process and return its PSResult."""
    return follow(start_local(config, data, gate), config, timeout=config.timeout * 4)


def train_on_cluster(cluster, config: PSConfig, on_update=None, timeout: float = 120.0) -> PSResult:
    """Run ``config`` on the engines of ``cluster`` (after ``setup_comm(cluster)``).

    A crashed worker (``config.crash``) reports status "crashed"; a worker engine that
    died (``crash_kills``, or killed from outside) yields None in ``result.workers``; the
    shards report either in ``result.lost``. After a run that lost a worker whose engine
    lives on, the engines' comms are rebuilt (:func:`~coursekit.comm.reset_comm`): messages
    the shards sent it must not reach the next run.
    """
    check_may_kill(cluster, bool(config.crash) and config.crash_kills, "crash_kills=True")
    result = follow(EngineRuns(cluster, config), config, on_update, timeout)
    if result.lost and all(report is not None for report in result.workers):
        reset_comm(cluster)
    return result
