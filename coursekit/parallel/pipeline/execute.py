"""Run a schedule for real: each rank holds its stages of the chapter-1 MLP and exchanges
activations (forward) and gradients (backward) with its neighbours over a Comm.

The model's L layers are cut into ``schedule.n_stages`` equal stages (stage s has layers
s L/S ... (s+1) L/S - 1) and stage s lives on rank s % p. The batch is cut into m
micro-batches of n_i rows (``np.array_split``); the loss is a mean over the whole batch of
N rows, so the last stage seeds each micro-batch's backward with (n_i / N) dC_i/dZ^L and
the gradients of all micro-batches simply add up to the whole batch's gradient:

    dC/dtheta = sum_i (n_i / N) dC_i/dtheta      (C_i: mean loss of micro-batch i)

Each action runs what its letter says (:mod:`.actions`): F each layer's ``forward``; B
(full backward) each layer's fused ``backward`` kernel; I (input gradient) delta =
G * sigma'(A), G_prev = delta W^T, keeping delta; W (weight gradient) dW += A_prev^T delta,
db += sum(delta), from I's delta; I and W in NumPy (layers compute Z = A_prev W + b).

Devices: F and B run the layers' kernels, so on the GPU for an MLP with ``device="cuda"``
(each rank on its engine's GPU); the loss at the last stage and the hand-overs stay on
the host. I and W are NumPy on the host, so a schedule that splits the backward
(zero-bubble) is refused for a CUDA MLP (:func:`check_step`): its measured timeline would
compare GPU F with host I and W.

Activation recomputation (``recompute=True``, "gradient checkpointing"): F keeps only each
stage's input A^0 of a micro-batch, not the outputs of the stage's k layers; B runs the
stage's forward again from A^0 before its backward. Activation memory per in-flight
micro-batch drops from n_i (w_0 + w_1 + ... + w_k) to n_i w_0 values (w_j: layer widths),
compute grows by one forward of the stage (k more layer forwards per micro-batch), and the
gradients are bit for bit the same (the same forward, the same numbers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.comm.trace import now
from coursekit.collectives.tags import TAG_BASE
from coursekit.nn import activations, reference
from coursekit.nn.mlp import MLP

from ..spans import Span
from .actions import BACKWARD_INPUT
from .schedule_type import Schedule
from .validate import validate


@dataclass(frozen=True)
class StepResult:
    """One rank's part of a pipelined step.

    ``grad``: full-size flat gradient with this rank's layers filled (zeros elsewhere), so
    summing every rank's ``grad`` gives the whole gradient; ``loss``: the batch loss on the
    rank holding the last stage, 0.0 elsewhere (so the sum is the loss too); ``timeline``:
    measured compute Spans in seconds on the shared monotonic clock (``comm.trace.now``).
    """

    rank: int
    loss: float
    grad: np.ndarray
    timeline: list[Span]
    peak_activation_bytes: int = 0  # most activation bytes this rank held at once
    layer_forwards: int = 0         # layer forwards run, recomputed ones included
    device: str = "cpu"             # where this rank computed: "cpu" or "cuda:<id>"


def stage_layers(n_layers: int, n_stages: int) -> list[range]:
    """Layer indices of every stage; ValueError unless the stages split the layers evenly."""
    n_stages = checks.integer(n_stages, "n_stages", at_least=1, hint=" (pipeline stages)")
    if n_layers % n_stages:
        allowed = [d for d in range(1, n_layers + 1) if n_layers % d == 0]
        raise ValueError(f"{n_stages} pipeline stages (ranks x chunks) cannot split the MLP's "
                         f"{n_layers} layers evenly; allowed stage counts: {allowed} "
                         "(add layers, or change stages or chunks)")
    k = n_layers // n_stages
    return [range(s * k, (s + 1) * k) for s in range(n_stages)]


def _tag(direction: int, stage: int, mb: int, m: int) -> int:
    """A tag per (direction, receiving stage, micro-batch); below the collectives' tags."""
    return (2 * stage + direction) * m + mb


def check_step(schedule: Schedule, mlp, X, y, recompute):
    """The arguments of :func:`execute` checked (TypeError / ValueError naming what is
    allowed): ``(recompute, each stage's layers, X, y)``."""
    recompute = checks.boolean(recompute, "recompute")
    validate(schedule)
    checks.instance(mlp, "mlp", MLP, " (coursekit.nn.MLP)")
    m, S = schedule.microbatches, schedule.n_stages
    stages = stage_layers(len(mlp.layers), S)
    split = sorted({a.kind for acts in schedule.actions for a in acts} & {"I", "W"})
    if split and mlp.device == "cuda":
        raise ValueError(f"schedule {schedule.name!r} splits the backward ({' and '.join(split)} "
                         "actions), which runs in NumPy on the host, but the MLP computes on "
                         "device='cuda'; allowed: a schedule with full backwards (B: gpipe, "
                         "1f1b, interleaved_1f1b), or an MLP with device='cpu'")
    X, y = mlp.check_batch(X, y)
    if len(X) < m:
        raise ValueError(f"the batch has {len(X)} rows, fewer than the {m} micro-batches; "
                         f"allowed: microbatches <= batch size")
    if _tag(1, S - 1, m - 1, m) >= TAG_BASE:
        raise ValueError(f"{S} stages x {m} micro-batches need more message tags than the "
                         f"{TAG_BASE} below the collectives' range; use fewer")
    return recompute, stages, X, y


def execute(comm, schedule: Schedule, mlp, X, y, *, recompute: bool = False) -> StepResult:
    """Run ``schedule`` on this rank (``comm.rank``) for the batch (X, y); see the module doc
    (``recompute``: activation recomputation)."""
    recompute, stages, X, y = check_step(schedule, mlp, X, y, recompute)
    p, m, S = schedule.stages, schedule.microbatches, schedule.n_stages
    if comm.size != p:
        raise ValueError(f"the schedule has {p} ranks but the comm has {comm.size}; "
                         "they must match")
    N = len(X)
    rows = np.array_split(np.arange(N), m)
    loss_fn = reference.softmax_xent if mlp.loss == "softmax_xent" else reference.mse
    rank = comm.rank
    grad = np.zeros_like(mlp.params)
    inputs, out_grads, acts, deltas = {}, {}, {}, {}  # keyed by (stage, micro-batch)
    loss, spans = 0.0, []
    memory = {"peak": 0, "forwards": 0}

    def note_held():
        held = {id(a): a.nbytes for kept in acts.values() for a in kept}
        memory["peak"] = max(memory["peak"], sum(held.values()))

    def stage_forward(s, a0):
        a = [a0]
        for l in stages[s]:
            a.append(mlp.layers[l].forward(a[-1]))
        memory["forwards"] += len(stages[s])
        return a

    def forward(s, i):
        a = stage_forward(s, X[rows[i]] if s == 0 else inputs.pop((s, i)))
        acts[s, i] = a
        note_held()
        if recompute:
            acts[s, i] = a[:1]  # the stage's input only: B recomputes the rest
        if s == S - 1:
            c, g = loss_fn(a[-1], y[rows[i]])
            w = len(rows[i]) / N
            out_grads[s, i] = g * w
            return c * w
        inputs[s + 1, i] = a[-1]
        return 0.0

    def backward(s, i, weights):
        """B (``weights``: input and weight gradients) or I (input gradient, keeps delta)."""
        g = out_grads.pop((s, i))
        if recompute:
            acts[s, i] = stage_forward(s, acts[s, i][0])
            note_held()
        a = acts[s, i]
        keep = []
        for k, l in reversed(list(enumerate(stages[s]))):
            layer, need_input = mlp.layers[l], l > 0
            if weights:
                g, lg = layer.backward(a[k], a[k + 1], g, input_grad=need_input)
                grad[layer.span] += lg
            else:
                delta = g * activations.derivative(a[k + 1], layer.activation)
                keep.append(delta)
                g = delta @ layer.W.T if need_input else None
        if weights:
            del acts[s, i]
        else:
            deltas[s, i] = keep[::-1]
        if s > 0:
            out_grads[s - 1, i] = g

    def weight(s, i):
        a = acts.pop((s, i))
        for k, (l, delta) in enumerate(zip(stages[s], deltas.pop((s, i)))):
            layer = mlp.layers[l]
            gl = grad[layer.span]
            gl[: layer.W.size] += (a[k].T @ delta).ravel()
            gl[layer.W.size:] += delta.sum(axis=0)

    comm.barrier()
    for act in schedule.actions[rank]:
        s, i = act.stage, act.mb
        t0 = now()
        if act.kind == "F":
            loss += forward(s, i)
        elif act.kind in BACKWARD_INPUT:
            backward(s, i, weights=act.kind == "B")
        elif act.kind == "W":
            weight(s, i)
        elif act.kind == "SEND_F":
            comm.send(inputs.pop((s + 1, i)), schedule.rank_of(s + 1), _tag(0, s + 1, i, m))
        elif act.kind == "RECV_F":
            inputs[s, i] = comm.recv(schedule.rank_of(s - 1), _tag(0, s, i, m))
        elif act.kind == "SEND_B":
            comm.send(out_grads.pop((s - 1, i)), schedule.rank_of(s - 1), _tag(1, s - 1, i, m))
        else:  # RECV_B
            out_grads[s, i] = comm.recv(schedule.rank_of(s + 1), _tag(1, s, i, m))
        if act.is_compute:
            spans.append(Span.of_action(rank, act, t0, now()))
    return StepResult(rank, float(loss), grad, spans, memory["peak"], memory["forwards"],
                      mlp.device_name)


@dataclass(frozen=True)
class PipelineRun:
    """A whole pipelined step gathered from all ranks (see :func:`run_pipeline`).

    ``timeline[r]``: rank r's measured Spans in seconds from the earliest start, directly
    comparable with ``simulate(...).timeline``; ``peak_activation_bytes[r]`` and
    ``layer_forwards[r]`` and ``devices[r]``: rank r's (see :class:`StepResult`).
    """

    loss: float
    grad: np.ndarray
    timeline: list[list[Span]]
    peak_activation_bytes: list[int]
    layer_forwards: list[int]
    devices: list = dataclasses.field(default_factory=list)


def combine_ranks(results: list[StepResult]) -> PipelineRun:
    """Add the ranks' disjoint gradients and losses; shift the timeline to start at 0."""
    t0 = min((s.start for r in results for s in r.timeline), default=0.0)
    timeline = [[s._replace(start=s.start - t0, end=s.end - t0) for s in r.timeline] for r in results]
    return PipelineRun(sum(r.loss for r in results), sum(r.grad for r in results), timeline,
                       [r.peak_activation_bytes for r in results],
                       [r.layer_forwards for r in results], [r.device for r in results])


def run_pipeline(runner, schedule: Schedule, data, *, mlp, recompute: bool = False,
                 timeout: float | None = None) -> PipelineRun:
    """One pipelined training step: :func:`execute` on the first ``schedule.stages`` ranks
    of ``runner`` (ThreadComm ranks or a cluster's engines, :mod:`coursekit.cluster.runner`),
    gathered into one :class:`PipelineRun`.

    Every chapter's experiment shape, a runner, then the config, then the data: the
    (validated) ``schedule`` is the config, ``data`` the batch as an ``(X, y)`` pair,
    ``mlp`` the model whose stages the ranks hold. ``recompute``: activation
    recomputation (see the module doc). Everything is checked before any rank starts.
    """
    from coursekit.cluster.runner import Runner

    checks.instance(runner, "runner", Runner, " (LocalRunner(n) or ClusterRunner(cluster))")
    X, y = checks.data_pair(data, "data")
    check_step(schedule, mlp, X, y, recompute)  # before any rank starts
    if schedule.stages > runner.size:
        raise ValueError(f"the schedule has {schedule.stages} ranks but {runner.describe()} has "
                         f"{runner.size}; allowed: schedules of at most {runner.size} rank(s)")
    return combine_ranks(runner.run(execute, schedule, mlp, X, y, recompute=recompute,
                                    ranks=schedule.stages, timeout=timeout))
