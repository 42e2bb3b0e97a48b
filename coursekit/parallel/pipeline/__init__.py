"""Pipeline parallelism: a schedule is data, validated, simulated and executed.

>>> from coursekit.parallel.pipeline import schedule, simulate
>>> s = schedule("1f1b", stages=4, microbatches=8)
>>> r = simulate(s, t_f=1.0, t_i=1.0, t_w=1.0)  # B = I + W lasts 2
>>> round(r.bubble_fraction, 4)  # (p-1)/(m+p-1) = 3/11
0.2727

The same :class:`Schedule` drives :func:`simulate` and :func:`execute` (which runs it on
ranks over a Comm with stages of the chapter-1 MLP).
"""

from .actions import COMM, COMPUTE, MEANING, Action, B, F, I, W
from .execute import PipelineRun, StepResult, combine_ranks, execute, run_pipeline, stage_layers
from .play import Deadlock, Span
from .schedule_type import Schedule
from .schedules import NAMES, schedule
from .simulate import SimResult, peak_activations, simulate
from .validate import ScheduleError, validate

__all__ = ["COMM", "COMPUTE", "MEANING", "NAMES", "Action", "B", "Deadlock", "F", "I", "PipelineRun",
           "Schedule", "ScheduleError", "SimResult", "Span", "StepResult", "W", "combine_ranks", "execute",
           "peak_activations", "run_pipeline", "schedule", "simulate", "stage_layers", "validate"]
