"""Asynchronous SGD on a sharded parameter server: SSP and ASP (Downpour) workers, and runners.

The SSP / ASP worker at step t (``sync`` = SSP or a warm-up step):

* pull: ask every shard for its weights (SSP: the shard answers only when
  ``t - min_clock <= s``; ASP: every ``n_fetch`` steps, at once);
* compute ``g = dC/dw`` on its next mini-batch;
* sync: push ``g`` with clock t + 1 and the versions it was computed on;
* ASP: ``w <- w - lr g`` on its own copy (Downpour), add ``g`` to the accrued gradient and
  push that every ``n_push`` steps (and at the end).

:func:`train_ps` is the SPMD entry every rank calls with its Comm (shards on ranks 0..S-1,
workers on S..S+W-1: a :class:`~.protocol.PSTopology`; BSP runs the lockstep loops of
:mod:`.bsp`). :func:`train` runs it on a runner (ThreadComm ranks or a live cluster's
engines, :mod:`coursekit.cluster.runner`), streams the workers' progress to ``on_update``
(:mod:`coursekit.cluster.live`) and returns a
:class:`~coursekit.parallel.param_server.results.PSResult`.

    >>> from coursekit.cluster.runner import LocalRunner
    >>> r = train(LocalRunner(4), PSConfig(model="ssp", staleness=2, steps=40), workers=3)
    >>> int(r.staleness.max()) <= 2
    True
"""

from __future__ import annotations

import numpy as np

from coursekit import checks
from coursekit.comm.trace import now
from coursekit.datafile import digest
from coursekit.parallel.faults import check_may_kill
from coursekit.parallel.param_server.server import ShardServer, serve
from coursekit.parallel.param_server.bsp import bsp_serve, bsp_work
from coursekit.parallel.param_server.config import PSConfig
from coursekit.parallel.param_server.consistency import combined_push, ssp_gate
from coursekit.parallel.param_server.protocol import EVICTED, HELLO, PSTopology
from coursekit.parallel.param_server.results import (PSResult, ServerFailure, ServerReport,
                                                     WorkerReport)
from coursekit.parallel.param_server.worker import Crashed, ShardSilent, Worker
from coursekit.cluster.runner import Runner

__all__ = ["PSConfig", "PSResult", "PSTopology", "ServerFailure", "async_work", "collect", "train",
           "train_ps"]


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
    except ShardSilent as silent:
        return me.leave(silent)


def train_ps(comm, config: PSConfig, data=None, *, servers: int = 1,
             gate=ssp_gate) -> ServerReport | WorkerReport:
    """Every rank's part of one run on ``comm``: a ServerReport (ranks ``0 .. servers-1``)
    or a WorkerReport (the other ``comm.size - servers`` ranks, the workers).

    ``data``: a :class:`coursekit.data.Dataset` (default: ``load_digits()``). ``gate``:
    the SSP clock gate the shards use (the exercise swaps in the student's).
    """
    checks.instance(config, "config", PSConfig)
    topology = config.check_topology(PSTopology.on(comm.size, servers))
    rank = comm.rank
    checkpoints = config.checkpoint_every or config.resume
    if data is None and (rank >= topology.servers or checkpoints):
        from coursekit.data import load_digits
        data = load_digits()
    if rank < topology.servers:
        run = (config.fingerprint(topology, digest((data.X_train, data.y_train)))
               if checkpoints else None)  # the shards' checkpoints record which run wrote them
        role = ShardServer(comm, config, topology, rank, gate, run)
    else:
        role = Worker(comm, config, topology, rank - topology.servers, data)
    comm.barrier()  # everyone built its state (and compiled its kernels): start the clocks
    saved = comm.timeout
    comm.timeout = config.timeout
    try:
        role.t0 = now()
        bsp = config.model == "bsp"
        if rank < topology.servers:
            return bsp_serve(role) if bsp else serve(role)
        return bsp_work(role) if bsp else async_work(role)
    finally:
        comm.timeout = saved


def check_data(config: PSConfig, data) -> None:
    """``data``: None (the digits) or a :class:`coursekit.data.Dataset` whose features fit
    ``config.sizes[0]``; its train and test splits are checked as (X, y) pairs."""
    if data is None:
        return
    from coursekit.data import Dataset
    checks.instance(data, "data", Dataset, " (e.g. coursekit.data.load_digits()) or None")
    checks.data_pair((data.X_train, data.y_train), "data (X_train, y_train)",
                     features=config.sizes[0])
    checks.data_pair((data.X_test, data.y_test), "data (X_test, y_test)",
                     features=config.sizes[0])


def collect(config: PSConfig, topology: PSTopology, outputs: list) -> PSResult:
    """The PSResult of the ranks' outputs (None for a worker whose process died, or a shard
    that crashed: :class:`ServerFailure`)."""
    servers = outputs[:topology.servers]
    if any(s is None for s in servers):
        raise ServerFailure(topology, config.n_params, servers, outputs[topology.servers:])
    return PSResult(config, topology, np.concatenate([s.params for s in servers]), servers,
                    list(outputs[topology.servers:topology.n_ranks]))


def train(runner: Runner, config: PSConfig, data=None, *, workers: int | None = None,
          servers: int = 1, on_update=None, gate=ssp_gate,
          timeout: float | None = None) -> PSResult:
    """Run ``config`` on the first ``servers + workers`` ranks of ``runner`` (ThreadComm
    ranks or engines, :mod:`coursekit.cluster.runner`) and return its PSResult: ``servers`` shards
    on ranks ``0 .. servers-1``, then ``workers`` workers (default: every other rank).

    ``data``: a :class:`coursekit.data.Dataset` (None: every rank loads the digits);
    ``on_update(data)``: the workers' live progress, one dict per rank; ``gate``: the SSP
    clock gate (the exercise passes the student's). The shape is checked against
    ``config`` (:meth:`~PSConfig.check_topology`) before any rank starts.

    A crashed worker (``config.crash``) reports status "crashed"; a worker whose engine
    died (``crash_kills``, or killed from outside) yields None in ``result.workers``; the
    shards report either in ``result.lost``. A crashed shard (``config.server_crash``)
    stops the run: :class:`ServerFailure` names it, after every worker waited ``timeout``
    for it and left. After a run that lost a worker whose process
    lives on, the ranks' comms are rebuilt (:meth:`~coursekit.cluster.runner.Runner.reset_comms`):
    messages the shards sent it must not reach the next run.
    """
    checks.instance(runner, "runner", Runner, " (LocalRunner(n) or ClusterRunner(cluster))")
    checks.instance(config, "config", PSConfig)
    topology = config.check_topology(PSTopology.on(runner.size, servers, workers,
                                                   where=runner.describe()))
    check_data(config, data)
    checks.callback(gate, "gate", "(clock, clocks, staleness) -> bool,")
    checks.callback(on_update, "on_update", "(data), called with one dict per rank,")
    check_may_kill(runner, bool(config.crash) and config.crash_kills, "crash_kills=True")
    outputs = runner.run(train_ps, config, data, servers=topology.servers, gate=gate,
                         ranks=topology.n_ranks, on_update=on_update,
                         may_die=topology.worker_ranks, timeout=timeout)
    try:
        result = collect(config, topology, outputs)
    except ServerFailure:
        runner.reset_comms()  # the requests sent to the silent shard must not reach a next run
        raise
    if result.lost and all(report is not None for report in result.workers):
        runner.reset_comms()
    return result
