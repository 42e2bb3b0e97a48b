"""Time of one training step: arithmetic at a given throughput plus the gradient exchange.

Per GPU and step, with the set-up's b, m, t, p, N (:class:`~coursekit.memory.accounting.
TrainingSetup`) and F = the model's training FLOPs per sample (6 Ψ per token for a
transformer, 6 Ψ per row for the MLP, the lecture's count for ResNet-50):

* compute   = F b m / (t p) / throughput, times 4/3 with full recomputation (the forward,
  a third of the work, runs twice; Korthikanti et al. 2022) where the model has something
  to recompute (``checkpoint`` is not None: not the MLP);
* bubble    = compute (p - 1) / m: the pipeline's idle time (GPipe / 1F1B, Narayanan et
  al. 2021);
* communication: the data-parallel exchange of the GPU's Ψ' = Ψ/(t p) share over N GPUs,
  with the alpha-beta model of :mod:`coursekit.costmodel` (ring algorithms). Stages 0-2:
  one allreduce of the gradient, 2(N-1)/N Ψ' G bytes sent per GPU (stages 1-2 send the
  same: a reduce-scatter of the gradient and an all-gather of the weights, ZeRO Sec. 7).
  Stage 3: a reduce-scatter of the gradient plus an all-gather of the weights in the
  forward and again in the backward, 1.5 x the allreduce's volume.

Not counted: tensor-parallel allreduces, pipeline sends, optimizer arithmetic, and any
overlap of communication with compute (``total`` adds the three; overlapping them
perfectly would give max(compute + bubble, communication)).
"""

from __future__ import annotations

from dataclasses import dataclass

from coursekit import checks, costmodel
from coursekit.memory.accounting import TrainingSetup, bytes_per_param
from coursekit.memory.shapes import ModelShape

__all__ = ["StepTime", "step_time"]


@dataclass(frozen=True)
class StepTime:
    """Seconds of one step on one GPU, by activity."""

    compute: float
    bubble: float
    communication: float

    @property
    def total(self) -> float:
        """compute + bubble + communication (no overlap)."""
        return self.compute + self.bubble + self.communication


def step_time(model: ModelShape, setup: TrainingSetup, *, flops_per_s: float, alpha: float,
              beta: float, gamma: float = 0.0) -> StepTime:
    """The module docstring's estimate: ``flops_per_s`` is one GPU's sustained FLOP/s;
    ``alpha`` (s), ``beta`` (s/B) and ``gamma`` (s/B) the cost model's link parameters."""
    checks.instance(model, "model", ModelShape, " (coursekit.memory.ModelShape or a preset)")
    checks.instance(setup, "setup", TrainingSetup, " (coursekit.memory.TrainingSetup)")
    checks.real(flops_per_s, "flops_per_s", above=0)
    recompute = 4 / 3 if setup.recompute and model.checkpoint is not None else 1.0
    work = model.flops_per_sample * setup.micro_batch * setup.micro_batches * recompute
    compute = work / (setup.tp * setup.pp) / flops_per_s
    P, G, _ = bytes_per_param(setup.precision, setup.optimizer)
    local = model.n_params / (setup.tp * setup.pp)
    link = dict(alpha=alpha, beta=beta, gamma=gamma)
    if setup.stage < 3:
        comm = costmodel.predict("allreduce", "ring", setup.dp, G * local, **link)
    else:
        comm = (costmodel.predict("reduce_scatter", "ring", setup.dp, G * local, **link)
                + 2 * costmodel.predict("allgather", "ring", setup.dp, P * local, **link))
    return StepTime(compute, compute * (setup.pp - 1) / setup.micro_batches, float(comm))
