"""What a data-parallel run returns: each rank's arrays, and the run stacked over ranks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import DPConfig

__all__ = ["DPResult", "RankResult", "StepBreakdown", "combine_ranks"]


@dataclass(frozen=True)
class StepBreakdown:
    """Mean seconds per step, split so the parts add up to the whole:

        step = compute (slowest rank) + stage (host <-> device copies; 0 on the CPU)
               + communication (the rank that waited least)
               + other (waiting for ranks that arrived late, Python between the spans)

    ``stage`` is what staging adds to the slowest rank's work: max_k (compute_k + stage_k)
    - max_k compute_k. Per step, the longest rank's time >= max_k (compute_k + stage_k) +
    the least exposed communication, so ``other`` is never negative.
    """

    step: float
    compute: float
    communication: float
    other: float
    stage: float = 0.0

    def __str__(self) -> str:
        ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
        stage = f" + stage {ms(self.stage)} (host <-> GPU copies)" if self.stage else ""
        return (f"{ms(self.step)} ms/step on average = compute {ms(self.compute)} (slowest rank)"
                f"{stage} + communication {ms(self.communication)} + other {ms(self.other)} "
                f"(waiting for late ranks, Python overhead)")


@dataclass(frozen=True)
class RankResult:
    """One worker's view of the run, steps ``first_step`` .. ``first_step + len(loss) - 1``."""

    rank: int
    first_step: int
    params: np.ndarray
    loss: np.ndarray          # local mean loss per step (NaN where the worker had no rows)
    weight: np.ndarray        # n_k / B per step
    lr: np.ndarray
    step_s: np.ndarray        # wall time of each step (without reading the data)
    compute_s: np.ndarray     # forward + backward + optimizer (stretched on a straggler)
    io_s: np.ndarray          # reading this worker's rows
    spans: list               # Spans (coursekit.parallel.spans) of the last timeline_steps steps
    trace: list               # Messages of the same steps
    eval_steps: np.ndarray    # rank 0 only: steps after which the test accuracy was taken
    test_accuracy: np.ndarray
    hook_log: dict | None = None  # what the gradient_sum hook recorded (its ``log``), if any
    device: str = "cpu"           # where this worker computed: "cpu" or "cuda"
    stage_s: np.ndarray | None = None  # host <-> device copies per step (0 on the CPU)


@dataclass(frozen=True)
class DPResult:
    """A whole run: per-step arrays are (N, T) over workers and steps, T from ``first_step``.

    ``loss`` is the global batch loss sum_k (n_k / B) loss_k, the serial run's loss.
    Timing conventions (for the cost model): a step lasts as long as its slowest rank;
    ``compute_per_step`` is the median over steps of the slowest rank's compute; the
    exposed communication of a rank is its step time minus its compute, and
    ``comm_per_step`` takes the rank that waited least (the last to arrive waits for
    nobody, so its exchange time is the communication itself).

    On GPUs a step is t_compute + t_stage + t_comm: ``stage_s`` (N, T) holds each rank's
    host <-> device copies (None when every rank computed on the CPU: nothing staged),
    ``devices`` where each rank computed, and the exposed communication is the step time
    minus compute minus stage.
    """

    config: DPConfig
    n_workers: int
    first_step: int
    rank_params: list
    local_loss: np.ndarray
    weight: np.ndarray
    lr: np.ndarray
    step_s: np.ndarray
    compute_s: np.ndarray
    io_s: np.ndarray
    spans: list
    traces: list
    eval_steps: np.ndarray
    test_accuracy: np.ndarray
    hook_logs: list  # per rank: the gradient_sum hook's ``log`` (None without a hook)
    devices: list    # per rank: "cpu" or "cuda:<id>" (MLP.device_name)
    stage_s: np.ndarray | None = None

    def _stage_or_zeros(self) -> np.ndarray:
        """``stage_s``, or zeros like ``step_s`` when nothing was staged (CPU run)."""
        return np.zeros_like(self.step_s) if self.stage_s is None else self.stage_s

    @property
    def params(self) -> np.ndarray:
        return self.rank_params[0]

    @property
    def loss(self) -> np.ndarray:
        return np.where(self.weight > 0, self.weight * self.local_loss, 0.0).sum(axis=0)

    @property
    def time_per_step(self) -> float:
        return float(np.median(self.step_s.max(axis=0)))

    @property
    def compute_per_step(self) -> float:
        return float(np.median(self.compute_s.max(axis=0)))

    @property
    def stage_per_step(self) -> float:
        """Median over steps of what staging adds to the slowest rank's work (see
        :class:`StepBreakdown`); 0 on the CPU."""
        return float(np.median(self._stage_added()))

    @property
    def comm_per_step(self) -> float:
        return float(np.median(self._exposed_comm()))

    def _stage_added(self) -> np.ndarray:
        """Per step: max_k (compute_k + stage_k) - max_k compute_k."""
        return (self.compute_s + self._stage_or_zeros()).max(axis=0) - self.compute_s.max(axis=0)

    def _exposed_comm(self) -> np.ndarray:
        """Per step: min_k (step_k - compute_k - stage_k)."""
        return (self.step_s - self.compute_s - self._stage_or_zeros()).min(axis=0)

    def step_breakdown(self) -> StepBreakdown:
        """The mean step split into parts that add up (see :class:`StepBreakdown`)."""
        step = self.step_s.max(axis=0).mean()
        compute = self.compute_s.max(axis=0).mean()
        stage = self._stage_added().mean()
        communication = self._exposed_comm().mean()
        return StepBreakdown(float(step), float(compute), float(communication),
                             float(step - compute - stage - communication), float(stage))

    def bytes_sent(self) -> np.ndarray:
        """Bytes each rank sent per step, over the traced last steps."""
        return self._per_step(lambda m: m.op == "send")

    def bytes_through(self) -> np.ndarray:
        """Bytes each rank sent + received per step, over the traced last steps."""
        return self._per_step(lambda m: True)

    def _per_step(self, keep) -> np.ndarray:
        steps = min(self.config.timeline_steps, self.step_s.shape[1])
        moved = np.array([sum(m.nbytes for m in t if keep(m)) for t in self.traces], float)
        return moved / max(steps, 1)


def combine_ranks(config: DPConfig, results: list[RankResult]) -> DPResult:
    """Stack the ranks' results; RuntimeError if synchronous workers ended with different models.
    ``stage_s`` is kept when some rank computed on a GPU."""
    for r in results[1:]:
        if not np.array_equal(r.params, results[0].params):
            raise RuntimeError(f"rank {r.rank} ended with parameters different from rank 0's: "
                               "the synchronous workers diverged")
    stack = lambda name: np.stack([getattr(r, name) for r in results])  # noqa: E731
    return DPResult(config, len(results), results[0].first_step, [r.params for r in results],
                    stack("loss"), stack("weight"), results[0].lr, stack("step_s"),
                    stack("compute_s"), stack("io_s"), [s for r in results for s in r.spans],
                    [r.trace for r in results], results[0].eval_steps, results[0].test_accuracy,
                    [r.hook_log for r in results], [r.device for r in results],
                    stack("stage_s") if any(r.device != "cpu" for r in results) else None)
