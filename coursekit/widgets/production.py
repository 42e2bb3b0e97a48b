"""Chapter 09 panel: pick a comparison, the number of engines and the backend; Run puts the
course's step beside the library's (equal or not, time per step, bytes per rank).

Thin by design: Run calls :func:`coursekit.production.side_by_side.side_by_side` with the
controls' values; every run is kept and drawn as paired bars
(:func:`coursekit.viz.production.plot_side_by_side`). The backend control lists what
these comparisons can use on the engines: gloo, which carries the CPU float64 tensors both
sides compute with (NCCL carries GPU tensors only; the chapter's section 2 opens a group
with it where every engine has a GPU).
"""

from __future__ import annotations

import ipywidgets as widgets

from coursekit.production.side_by_side import EXPERIMENTS, side_by_side
from coursekit.viz.production import plot_side_by_side
from coursekit.widgets.panel import Panel, png, size_limit

__all__ = ["ProductionPanel"]

BACKENDS = ("gloo",)
"""What the comparisons run torch with (CPU float64 tensors, as the course computes)."""


class ProductionPanel(Panel):
    """Controls: the comparison, the number of engines (2 .. the cluster's size), the
    backend. ``cluster``: the engines (after ``setup_comm``); ``restart`` / ``prepare``: see
    :class:`~coursekit.widgets.panel.Panel`. ``panel.results`` keeps every row."""

    def __init__(self, *, cluster, restart=None, prepare=None, max_workers: int | None = None):
        top = size_limit("max_workers", max_workers, cluster, minimum=2)
        style = {"description_width": "110px"}
        self.experiment = widgets.Dropdown(options=list(EXPERIMENTS), description="comparison",
                                           style=style, layout=widgets.Layout(width="420px"))
        self.workers = widgets.IntSlider(min(4, top), min=2, max=top, description="engines",
                                         style=style, continuous_update=False)
        self.backend = widgets.Dropdown(options=BACKENDS, description="backend", style=style)
        super().__init__([self.experiment, self.workers, self.backend], columns=1,
                         keep_runs=True, cluster=cluster, restart=restart, prepare=prepare,
                         hint="Pick a comparison and the number of engines, then press Run.")

    def compute(self):
        """One comparison on the first ``workers`` engines."""
        return side_by_side(self.runner(), self.experiment.value, self.workers.value)

    def show(self, row) -> None:
        self.say(row.describe())
        self.plot.value = png(plot_side_by_side(self.results))
