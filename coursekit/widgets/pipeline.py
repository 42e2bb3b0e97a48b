"""Chapter 5 panel: pick a pipeline schedule and see its simulated timeline, bubble and memory.

Thin by design: every change of a control (and Run) calls
:func:`coursekit.parallel.pipeline.schedule` and :func:`~coursekit.parallel.pipeline.simulate`
and draws the result with :func:`coursekit.viz.pipeline.plot_schedule` as a PNG, so the
panel prints nothing and works headless (tests set ``panel.microbatches.value = 8`` and read
``panel.result``). Impossible settings (e.g. 1F1B with fewer micro-batches than stages)
show the error in the status line instead of raising (:class:`coursekit.widgets.panel.Panel`).
"""

from __future__ import annotations

import ipywidgets as widgets
from matplotlib.figure import Figure

from coursekit.parallel.pipeline import NAMES, schedule, simulate
from coursekit.viz.pipeline import plot_schedule
from coursekit.widgets.panel import Panel, png

__all__ = ["PipelinePanel"]


class PipelinePanel(Panel):
    """Controls: schedule, stages p, micro-batches m, chunks v, times of F / I / W (a full
    backward B lasts T_I + T_W), p2p cost.

    ``panel.result`` is the latest :class:`~coursekit.parallel.pipeline.SimResult` (None
    after an impossible setting); ``panel.status`` says bubble, time and memory or the error.
    """

    def __init__(self, name: str = "1f1b", stages: int = 4, microbatches: int = 8):
        style = {"description_width": "120px"}

        def slider(cls, value, lo, hi, step, label):
            return cls(value, min=lo, max=hi, step=step, description=label, style=style,
                       continuous_update=False)

        self.name = widgets.Dropdown(options=NAMES, value=name, description="schedule", style=style)
        self.stages = slider(widgets.IntSlider, stages, 1, 8, 1, "stages p")
        self.microbatches = slider(widgets.IntSlider, microbatches, 1, 32, 1, "micro-batches m")
        self.chunks = slider(widgets.IntSlider, 1, 1, 4, 1, "chunks v (interl.)")
        self.t_f = slider(widgets.FloatSlider, 1.0, 0.0, 3.0, 0.1, "T_F [units]")
        self.t_i = slider(widgets.FloatSlider, 1.0, 0.0, 3.0, 0.1, "T_I [units]")
        self.t_w = slider(widgets.FloatSlider, 1.0, 0.0, 3.0, 0.1, "T_W [units]")
        self.p2p = slider(widgets.FloatSlider, 0.0, 0.0, 1.0, 0.05, "p2p [units]")
        super().__init__([self.name, self.stages, self.microbatches, self.chunks,
                          self.t_f, self.t_i, self.t_w, self.p2p], columns=2, auto=True)
        self.run()

    def compute(self):
        """Build and simulate the schedule the controls describe."""
        chunks = self.chunks.value if self.name.value == "interleaved_1f1b" else 1
        sched = schedule(self.name.value, self.stages.value, self.microbatches.value, chunks)
        return simulate(sched, self.t_f.value, self.t_i.value, self.t_w.value, self.p2p.value)

    def show(self, r) -> None:
        peaks = ", ".join(f"{x:g}" for x in r.peak_activations)
        self.say(f"bubble {r.bubble_fraction:.1%} of {r.schedule.stages} x {r.total_time:.3g} "
                 f"time units; peak activations per rank (micro-batches): {peaks}")
        fig = Figure(figsize=(10, 0.5 * r.schedule.stages + 1.4))
        plot_schedule(r.timeline, ax=fig.add_subplot(), title=str(r.schedule).splitlines()[0])
        self.plot.value = png(fig)
