"""``torch.distributed.pipelining``'s GPipe and 1F1B beside chapter 5's executor.

Both sides train chapter 5's MLP (64 inputs, ``layers - 1`` hidden layers of ``hidden``
units, 10 classes, ReLU, float64, the same seed) cut into p equal stages, stage s on rank
s, for ``steps`` SGD steps w <- w - lr dC/dw on the same batch of N rows in m
micro-batches of N/m rows:

* the course: :func:`coursekit.parallel.pipeline.execute` with ``schedule(name, p, m)``;
  the last stage seeds micro-batch i's backward with (n_i/N) dC_i/dZ, so the gradients
  add up to the batch's mean-loss gradient;
* torch: one ``PipelineStage`` per rank (built by hand from the same layers, shapes given
  so no shape inference runs), ``ScheduleGPipe`` / ``Schedule1F1B`` with the loss
  ``cross_entropy`` (a mean over each micro-batch) and ``scale_grads=True``: the summed
  gradients are divided by m. With equal micro-batches n_i = N/m both are

      dC/dtheta = (1/m) sum_i dC_i/dtheta.

Only the order of the floating-point additions differs, so parameters and gradients agree
to rounding (:data:`RTOL`). Bytes: boundary b (between stages b and b+1) carries N n_b
numbers forward and as many back, so rank r sends 8 N (n_{r+1}[r < p-1] + n_r[r > 0])
bytes per step (:func:`coursekit.parallel.traffic.pipeline_bytes`), whatever the
schedule. The course's are counted by its trace, torch's by adding up the tensors of the
P2P sends its stage hands to ``batch_isend_irecv``.

Order: the course's schedule is data (:mod:`coursekit.parallel.pipeline.actions`) and
its executor runs that list. Torch's single-stage schedules run hand-written loops
(``_step_microbatches``) and describe them separately in ``schedule.pipeline_order`` (per
rank, with idle ``None`` slots); the order they really ran is recorded here by wrapping
the stage's ``forward_one_chunk``/``backward_one_chunk``. 1F1B runs the course's order on
every rank; GPipe runs the same forwards but its backwards in micro-batch order 0 ... m-1,
where the course's GPipe runs them last-in first-out (m-1 ... 0): the same gradient, summed
in another order.

Torch needs the shapes of every stage's input and output, and their gradients; given by
hand (``input_args``, ``output_args``, ``output_grads``, ``input_grads``), a received input
must be marked ``requires_grad`` or no input gradient is sent back and the earlier stages
get zero gradients, without an error (torch 2.13).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from coursekit import checks

from . import course_mlp
from .requirement import import_torch
from .torch_group import digits_or, torch_ranks

SCHEDULES = ("gpipe", "1f1b")
RTOL = 1e-10
"""Relative tolerance of parameters and gradients (float64; only the summation order of the
micro-batches and of BLAS differ, which after a few steps stays below ~1e-13)."""


@dataclass(frozen=True)
class PipelineConfig:
    """One comparison: ``schedule`` in :data:`SCHEDULES` on ``stages`` ranks (one stage each)
    with ``microbatches`` m, ``steps`` SGD steps of learning rate ``lr`` on the first
    ``batch`` digits; the MLP has ``layers`` layers (``hidden`` units wide), ``seed``."""

    schedule: str = "1f1b"
    stages: int = 4
    microbatches: int = 8
    steps: int = 2
    batch: int = 512
    layers: int = 8
    hidden: int = 512
    lr: float = 0.01
    seed: int = 0

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r}: allowed {', '.join(SCHEDULES)}")
        p = checks.integer(self.stages, "stages", at_least=2, hint=" (pipeline ranks)")
        m = checks.integer(self.microbatches, "microbatches", at_least=1)
        checks.integer(self.steps, "steps", at_least=1)
        n = checks.integer(self.batch, "batch", at_least=1, at_most=1347,
                           hint=" (rows of the digits training set)")
        layers = checks.integer(self.layers, "layers", at_least=2)
        checks.integer(self.hidden, "hidden", at_least=1, at_most=4096)
        checks.real(self.lr, "lr", above=0)
        checks.integer(self.seed, "seed", at_least=0)
        if layers % p:
            raise ValueError(f"layers={layers} do not split into stages={p} equal stages; "
                             f"allowed stages: divisors of {layers}")
        if self.schedule == "1f1b" and m < p:
            raise ValueError(f"1f1b needs microbatches >= stages ({m} < {p})")
        if n % m:
            raise ValueError(f"batch={n} is not a multiple of microbatches={m}: torch scales "
                             "the gradient by 1/m, the course by n_i/N; they agree only for "
                             "equal micro-batches")

    @property
    def sizes(self) -> tuple[int, ...]:
        return (64,) + (self.hidden,) * (self.layers - 1) + (10,)


@dataclass(frozen=True)
class PipelineComparison:
    """Per step (index t) and per rank (index r).

    ``loss``/``torch_loss``: the batch loss before step t; ``param_error``/``grad_error``:
    max |torch - course| / max |course| over all ranks at step t; ``course_order[r]``,
    ``torch_order[r]``: the F/B actions rank r ran, as "F3" / "B3" (micro-batch 3);
    ``torch_pipeline_order[r]``: rank r's F/B actions as torch's ``schedule.pipeline_order``
    describes them (a description for its visualizer, not what ``step`` runs: in torch
    2.13 Schedule1F1B's lists F1 ... F8 on the last rank of 8 micro-batches, which ran
    F0 ... F7);
    ``course_bytes[t, r]``/``torch_bytes[t, r]``: bytes rank r sent in step t (counted),
    ``formula_bytes[r]``: the formula's bytes per step; ``course_seconds``/``torch_seconds``: per step, the slowest rank's time.
    """

    config: PipelineConfig
    loss: np.ndarray
    torch_loss: np.ndarray
    param_error: np.ndarray
    grad_error: np.ndarray
    course_order: list
    torch_order: list
    torch_pipeline_order: list
    course_bytes: np.ndarray
    torch_bytes: np.ndarray
    formula_bytes: np.ndarray
    course_seconds: np.ndarray
    torch_seconds: np.ndarray

    @property
    def equal(self) -> bool:
        """Parameters and gradients agree within :data:`RTOL` at every step."""
        return bool(max(self.param_error.max(), self.grad_error.max()) <= RTOL)


def course_order(name: str, p: int, m: int) -> list[list[str]]:
    """Rank r's compute actions in chapter 5's schedule, as "F<mb>" / "B<mb>"."""
    from coursekit.parallel.pipeline import schedule

    sched = schedule(name, p, m)
    return [[f"{a.kind}{a.mb}" for a in sched.compute(r)] for r in range(p)]


def _torch_schedule(name, stage, m):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    return cls(stage, n_microbatches=m, loss_fn=course_mlp.loss_fn, scale_grads=True)


def _recorded(stage, order, sent):
    """Wrap this stage's compute and send-op builders: they append "F<i>"/"B<i>" to
    ``order`` and the bytes of every tensor handed to a P2P send to ``sent``."""
    def wrap(name, letter=None):
        inner = getattr(stage, name)

        def call(chunk, *args, **kwargs):
            result = inner(chunk, *args, **kwargs)
            if letter:
                order.append(f"{letter}{chunk}")
            else:
                sent.append(sum(op.tensor.numel() * op.tensor.element_size() for op in result))
            return result
        setattr(stage, name, call)

    wrap("forward_one_chunk", "F")
    wrap("backward_one_chunk", "B")
    wrap("get_fwd_send_ops")
    wrap("get_bwd_send_ops")


def _pipeline_order(sched, rank) -> list[str]:
    """Rank ``rank``'s F and B actions in torch's ``pipeline_order`` (idle slots and its
    final REDUCE_GRAD left out)."""
    from torch.distributed.pipelining.schedules import _ComputationType

    letter = {_ComputationType.FORWARD: "F", _ComputationType.FULL_BACKWARD: "B"}
    return [f"{letter[a.computation_type]}{a.microbatch_index}"
            for a in (sched.pipeline_order or {}).get(rank, [])
            if a is not None and a.computation_type in letter]


def _rank_compare(comm, config: PipelineConfig, X, y):
    """Engine side: both pipelines on this rank, step by step."""
    torch = import_torch()
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    from coursekit.comm.trace import recording
    from coursekit.nn import MLP
    from coursekit.parallel.pipeline import execute, schedule, stage_layers

    from .torch_group import process_group

    p, m, r = comm.size, config.microbatches, comm.rank
    mlp = MLP(config.sizes, "relu", dtype=np.float64, seed=config.seed)
    sched = schedule(config.schedule, p, m)
    layers = stage_layers(len(mlp.layers), p)[r]
    span = slice(mlp.layers[layers[0]].span.start, mlp.layers[layers[-1]].span.stop)
    module = course_mlp.layers_module(mlp, layers)
    rows = len(X) // m
    # the shapes of one micro-batch's input and output (and of their gradients), so no
    # shape inference runs; a received input must be marked requires_grad, or torch sends
    # no input gradient back and the earlier stages silently get zero gradients
    shape_in = torch.zeros(rows, config.sizes[layers[0]], dtype=torch.float64,
                           requires_grad=r > 0)
    shape_out = torch.zeros(rows, config.sizes[layers[-1] + 1], dtype=torch.float64)
    X_t, y_t = torch.from_numpy(np.ascontiguousarray(X)), torch.from_numpy(y.astype(np.int64))
    out = {k: [] for k in ("loss", "torch_loss", "param", "grad", "scale", "course_s",
                           "torch_s", "course_bytes", "torch_bytes")}
    with process_group(comm, "gloo"):  # CPU float64 tensors, as on the course's side
        stage = PipelineStage(module, r, p, torch.device("cpu"), input_args=(shape_in,),
                              output_args=shape_out,
                              output_grads=(torch.zeros_like(shape_out),) if r < p - 1 else None,
                              input_grads=(torch.zeros_like(shape_in),) if r > 0 else None)
        tsched = _torch_schedule(config.schedule, stage, m)
        order, sent = [], []
        _recorded(stage, order, sent)
        for step in range(config.steps):
            order.clear()
            sent.clear()
            comm.barrier()
            with recording(comm) as messages:
                t0 = time.perf_counter()
                result = execute(comm, sched, mlp, X, y)
                out["course_s"].append(time.perf_counter() - t0)
                out["course_bytes"].append(sum(msg.nbytes for msg in messages()
                                               if msg.op == "send"))
            dist.barrier()
            losses = []
            t0 = time.perf_counter()
            if r == 0:
                tsched.step(X_t)
            elif r == p - 1:
                tsched.step(target=y_t, losses=losses)
            else:
                tsched.step()
            out["torch_s"].append(time.perf_counter() - t0)
            out["torch_bytes"].append(sum(sent))
            grad_t = course_mlp.flat(module, mlp, layers, grad=True)[span]
            grad_c = result.grad[span]
            out["loss"].append(result.loss)
            out["torch_loss"].append(float(sum(losses)) / m if losses else 0.0)
            out["grad"].append(np.abs(grad_t - grad_c).max())
            out["scale"].append(np.abs(grad_c).max())
            mlp.params -= config.lr * result.grad
            course_mlp.sgd_step(module, config.lr)
            after_t = course_mlp.flat(module, mlp, layers)[span]
            out["param"].append(np.abs(after_t - mlp.params[span]).max()
                                / np.abs(mlp.params[span]).max())
        torch_order, described = list(order), _pipeline_order(tsched, r)
        del tsched, stage  # freed while the group lives (process_group collects garbage then)
    return out, torch_order, described


def pipeline_experiment(runner, config: PipelineConfig, data=None, *,
                        timeout: float | None = None) -> PipelineComparison:
    """Run both pipelines on the first ``config.stages`` engines of ``runner`` (a
    ClusterRunner after ``setup_comm``: torch needs one process per rank). ``data``: an
    (X, y) pair of at least ``config.batch`` rows (default: the digits training set)."""
    from coursekit.parallel import traffic

    checks.instance(config, "config", PipelineConfig)
    X, y = digits_or(data)
    if len(X) < config.batch:
        raise ValueError(f"data has {len(X)} rows, fewer than batch={config.batch}")
    X, y = X[:config.batch], y[:config.batch]
    p = torch_ranks(runner, config.stages, "torch.distributed.pipelining")
    ranks = runner.run(_rank_compare, config, X, y, ranks=p, timeout=timeout)
    outs = [o for o, _, _ in ranks]

    def per_step(key, reduce=np.max):
        return reduce(np.array([o[key] for o in outs]), axis=0)

    scale = per_step("scale")
    return PipelineComparison(
        config=config, loss=per_step("loss", np.sum), torch_loss=per_step("torch_loss", np.sum),
        param_error=per_step("param"), grad_error=per_step("grad") / scale,
        course_order=course_order(config.schedule, p, config.microbatches),
        torch_order=[t for _, t, _ in ranks], torch_pipeline_order=[t for _, _, t in ranks],
        course_bytes=np.array([o["course_bytes"] for o in outs]).T,
        torch_bytes=np.array([o["torch_bytes"] for o in outs]).T,
        formula_bytes=traffic.pipeline_bytes(config.sizes, config.batch, p),
        course_seconds=per_step("course_s"), torch_seconds=per_step("torch_s"))
