"""Synchronous data-parallel SGD: every worker holds the whole model and a slice of each batch.

Step t on worker k of N (the lecture's "Data parallel synchronous SGD"):

1. read its n_k rows of the global batch of B = sum_k n_k rows (:mod:`.sampler`);
2. forward + backward on them: the local mean gradient g_k (on ``config.device``; on a GPU
   the parameters and rows are staged to it and g_k back, recorded as "stage" spans);
3. combine: g = sum_k (n_k / B) g_k, which IS the gradient of the serial batch of B rows
   (allreduce, parameter server or parameter averaging: :mod:`.strategies`);
4. update: w <- w - eta_t g, with eta_t from the learning-rate rule (:mod:`.lr_rules`).

So N workers with n examples each train exactly like one worker with batch n * N: the
tests check that sync allreduce training on 1, 2, 3, 4 ranks gives the parameters of
:func:`coursekit.nn.train` on the concatenated batches (float64, tight tolerance). Synchronous
means every step waits for the slowest worker (:mod:`..spans` injects a straggler), and a
worker that dies stops the run: the others time out waiting for it, and the run's
:class:`~coursekit.cluster.runner.RankFailure` names it. :mod:`..checkpoint` saves every k steps;
``resume=True`` continues from the newest complete checkpoint whose files are intact and this
run's (damaged files and other runs' are skipped with a warning naming each and why) and gives
the uninterrupted run's parameters.

Per step: t_step = t_compute + t_stage + t_comm (t_stage = 0 on the CPU), each worker's
``compute_s``, ``stage_s`` and the rest of ``step_s`` in :class:`RankResult`.

Run it with :func:`train` on a runner (ThreadComm ranks or engines, :mod:`coursekit.cluster.runner`);
it returns a :class:`DPResult`. Set ``config.bucket_bytes`` to
overlap the gradient allreduce with the backward pass (:mod:`.buckets`).
"""

from __future__ import annotations

import os
from collections import deque

import numpy as np

from coursekit import checks
from coursekit.cluster import live
from coursekit.comm.trace import now
from coursekit.datafile import as_source, digest
from coursekit.nn import reference
from coursekit.nn.mlp import MLP
from coursekit.nn.optim import Momentum, make_optimizer
from coursekit.parallel.faults import check_may_kill
from coursekit.cluster.runner import Runner

from .config import DPConfig
from .results import DPResult, RankResult, combine_ranks
from .strategies import Exchange, check_gradient_sum
from .lr_rules import LRSchedule
from .sampler import Sampler
from ..checkpoint import RankState
from ..spans import COMPUTE_KINDS, STAGE_KINDS, SpanRecorder, step_totals

__all__ = ["DPConfig", "DPResult", "RankResult", "WorkerCrashed", "train", "train_worker"]


class WorkerCrashed(RuntimeError):
    """The injected fault: a worker dies (raised on in-process ranks; engines exit)."""


def _crash(rank: int, step: int) -> None:
    from coursekit.cluster import this_engine

    try:
        this_engine()
    except RuntimeError:  # a thread in this process: raise instead of killing the process
        raise WorkerCrashed(f"worker rank {rank} crashed at step {step} (injected fault)") from None
    os._exit(1)  # an engine process dies for real, like a node that fails


def _local_gradient(mlp, X, y, grad, exchange, rec) -> float:
    """Mean loss of (X, y); its gradient into ``grad``.

    Without overlap: one fused call (Numba on the CPU; on a GPU staged in, computed, staged
    out, timed as "stage", "compute", "stage" spans). With overlap or ``backward="layers"``
    (CPU only): layer by layer in NumPy (:mod:`coursekit.nn.reference`), launching every bucket the moment its
    last layer's gradient exists. NumPy's matrix products release the GIL, so the reducer
    thread communicates while the earlier layers compute (the Numba kernels hold the GIL).
    """
    if not exchange.overlapping and exchange.cfg.backward == "fused":
        return mlp.loss_and_grad(X, y, out=grad, validate=False, timer=rec.part)[0]
    with rec.compute("forward"):
        acts = reference.forward(mlp.params, mlp.sizes, mlp.activation, X)
        loss_fn = reference.softmax_xent if mlp.loss == "softmax_xent" else reference.mse
        loss, g = loss_fn(acts[-1], y)
    for layer in reversed(mlp.layers):
        with rec.compute("backward"):
            dW, db, g = reference.layer_backward(layer.W, acts[layer.index],
                                                 acts[layer.index + 1], g, layer.activation)
            grad[layer.span] = np.concatenate([dW.ravel(), db])
        exchange.layer_done(layer.index)
    return loss


def _no_rows(mlp, grad, exchange) -> float:
    """A worker without rows in a short last batch contributes zeros (its weight is 0)."""
    grad[...] = 0
    for layer in reversed(mlp.layers):
        exchange.layer_done(layer.index)
    return float("nan")


def train_worker(comm, config: DPConfig, data, eval_data=None, *, resume: bool = False,
                 gradient_sum=None) -> RankResult:
    """Run the whole training on this rank (every rank of ``comm`` calls it).

    ``data``: a row source of :mod:`coursekit.datafile` (each worker reads only its rows),
    an ``(X, y)`` pair or a packed file's path. ``eval_data``: ``(X_test, y_test)`` for the
    test accuracy on rank 0. ``resume``: start from the newest complete, intact checkpoint.
    ``gradient_sum``: another way to sum the gradients (see :class:`.strategies.Exchange`),
    e.g. :class:`coursekit.parallel.compression.experiment.GradientSum`.
    """
    cfg = config
    n, rank = cfg.check_workers(comm.size), comm.rank
    resume = checks.boolean(resume, "resume")
    source = as_source(data)
    mlp = MLP(cfg.sizes, cfg.activation, cfg.loss, dtype=cfg.dtype, seed=cfg.seed,
              device=cfg.worker_device)
    opt = make_optimizer(mlp.params, cfg.lr, cfg.momentum)
    schedule = LRSchedule(cfg.lr, cfg.lr_rule, n, cfg.warmup_steps)
    sampler = Sampler(len(source), cfg.batch_size, cfg.seed)
    total, start = cfg.total_steps(len(source)), 0
    run = cfg.fingerprint(n, digest(source)) if resume or cfg.checkpoint_every else None
    if resume:
        start = _restore(cfg, rank, n, run, mlp, opt, sampler)
    rec = SpanRecorder(rank, cfg.slow_factor if rank == cfg.straggler_rank else 1.0)
    reporter = live.Reporter(cfg.publish_interval, series=("loss", "weight", "step_s"))
    grad = np.empty_like(mlp.params)
    steps = max(total - start, 0)
    loss, weight, lr, step_s, compute_s, stage_s, io_s = (np.full(steps, np.nan)
                                                          for _ in range(7))
    window = max(start, total - cfg.timeline_steps)
    kept_spans: deque = deque()
    evals: list[tuple[int, float]] = []
    was_tracing, mark = comm.tracing, comm.trace.total
    exchange = Exchange(comm, cfg, mlp, opt, rec, gradient_sum)
    try:
        for i, step in enumerate(range(start, total)):
            if rank == cfg.crash_rank and step == cfg.crash_step:
                _crash(rank, step)
            if step == window:
                comm.tracing, mark = True, comm.trace.total
            t0 = now()
            rows, weight[i] = sampler.local(step, rank, n)
            X, y = source.rows(rows)
            t1 = now()
            lr[i] = opt.lr = schedule(step)
            exchange.begin(grad, weight[i])
            if len(rows):
                X, y = mlp.check_batch(X, y)
                loss[i] = _local_gradient(mlp, X, y, grad, exchange, rec)
            else:
                loss[i] = _no_rows(mlp, grad, exchange)
            exchange.update(step, grad, weight[i], last=step == total - 1)
            spans = rec.take()
            io_s[i], step_s[i] = t1 - t0, now() - t1
            compute_s[i] = step_totals(spans, COMPUTE_KINDS)
            stage_s[i] = step_totals(spans, STAGE_KINDS)
            if step >= window:
                kept_spans.extend(spans)
            if rank == 0 and eval_data is not None and (
                    step == total - 1 or (cfg.eval_every and (step + 1) % cfg.eval_every == 0)):
                evals.append((step + 1, mlp.accuracy(*eval_data)))
            if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
                _save(cfg, rank, n, run, step + 1, mlp, opt, sampler)
            reporter.log(step=step + 1, total=total, loss=float(loss[i]), weight=float(weight[i]),
                         step_s=float(step_s[i]), spans=spans, evals=list(evals))
    finally:
        exchange.close()
        reporter.close()
        trace = comm.trace.since(mark) if comm.tracing else []
        if not was_tracing:
            comm.trace.forget_since(mark)
        comm.tracing = was_tracing
    ev = np.array(evals, dtype=float).reshape(-1, 2)
    return RankResult(rank, start, mlp.params.copy(), loss, weight, lr, step_s, compute_s, io_s,
                      list(kept_spans), trace, ev[:, 0].astype(int), ev[:, 1], exchange.hook_log,
                      device=mlp.device_name, stage_s=stage_s)


def _velocity(opt) -> np.ndarray:
    return opt.velocity if isinstance(opt, Momentum) else np.empty(0, opt.params.dtype)


def _save(cfg, rank, n, run, step, mlp, opt, sampler) -> None:
    rng_state, permutation, _ = sampler.state()
    RankState(rank, n, step, mlp.params.copy(), _velocity(opt).copy(), rng_state, permutation,
              run).save(cfg.checkpoint_dir)


def _restore(cfg, rank, n, run, mlp, opt, sampler) -> int:
    """Load the newest checkpoint of the run ``run`` whose every rank's file fits this run's
    buffers (unusable newer files are skipped with a warning) and return its step."""
    like = {"size": n, "params": mlp.params, "velocity": _velocity(opt),
            "permutation": np.empty(sampler.n_rows, np.int64)}
    ckpt = RankState.load(cfg.checkpoint_dir, rank, n, run, like=lambda r: like)
    mlp.params[...] = ckpt.params
    _velocity(opt)[...] = ckpt.velocity
    sampler.restore(ckpt.rng_state, ckpt.permutation, (ckpt.step - 1) // sampler.steps_per_epoch)
    return ckpt.step


def train(runner: Runner, config: DPConfig, data, eval_data=None, *, workers: int | None = None,
          resume: bool = False, on_update=None, progress: bool = False, gradient_sum=None,
          timeout: float | None = None) -> DPResult:
    """Train on the first ``workers`` ranks of ``runner`` (default all of them): a
    :class:`~coursekit.cluster.runner.LocalRunner` (ThreadComm ranks: tests, exercises, quick demos)
    or a :class:`~coursekit.cluster.runner.ClusterRunner` (engines, after ``setup_comm``).

    ``data``: on engines preferably a :class:`~coursekit.datafile.PackedFile` (each engine
    maps it), or a small ``(X, y)`` pair (shipped to every rank). ``on_update(data)`` /
    ``progress``: follow the run live (:func:`coursekit.cluster.live.follow`); ``gradient_sum``:
    the hook that replaces the exchange's gradient sum (chapter 6's compressed exchange).
    A failed run raises :class:`~coursekit.cluster.runner.RankFailure` naming the worker(s) whose
    error stopped it.
    """
    checks.instance(config, "config", DPConfig)
    checks.instance(runner, "runner", Runner, " (LocalRunner(n) or ClusterRunner(cluster))")
    check_may_kill(runner, config.crash_rank is not None, "crash_rank (a data-parallel "
                   "crash ends its engine process)")
    n = runner.check_workers(config.check_workers(runner.size if workers is None else workers))
    if isinstance(data, tuple):
        checks.data_pair(data, "data", features=config.sizes[0])
    if not isinstance(data, (str, os.PathLike)):  # a path is opened where the ranks run
        as_source(data)  # bad data fails here, with its TypeError or ValueError
    if eval_data is not None:
        checks.data_pair(eval_data, "eval_data", features=config.sizes[0])
    check_gradient_sum(config, gradient_sum)
    checks.boolean(resume, "resume")
    checks.callback(on_update, "on_update", "(data), called with one dict per rank,")
    checks.boolean(progress, "progress")
    if resume and not config.checkpoint_dir:
        raise ValueError("resume=True needs config.checkpoint_dir (where the checkpoints are)")
    results = runner.run(train_worker, config, data, eval_data, ranks=n, resume=resume,
                         gradient_sum=gradient_sum, on_update=on_update, progress=progress,
                         interval=config.publish_interval or 0.1, timeout=timeout)
    return combine_ranks(config, results)
