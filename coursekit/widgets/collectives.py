"""Chapter 2 panel: run a collective on the live ranks, plot measured vs predicted.

Thin by design: Run reads the controls and calls the pure experiment
:func:`coursekit.collectives.timing.measure` on the panel's runner: the engines of its
cluster, or a ``runner=LocalRunner(n)`` (ThreadComm ranks). The plot is a
PNG; layout, Run / Stop, errors and a lost cluster are handled by
:class:`coursekit.widgets.panel.Panel` (tests set ``panel.collective.value = "bcast"`` and
call ``panel.run()``).
"""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np
from matplotlib.figure import Figure

from coursekit.collectives import ALGORITHMS, DEFAULT_ALGORITHM
from coursekit.collectives.timing import measure
from coursekit.viz import byte_label, color, legend_outside
from coursekit.widgets.panel import Panel, png, run_target, size_limit

__all__ = ["CollectivesPanel", "plot_timing"]

SIZES = tuple(1 << k for k in range(10, 27, 2))  # 1 KiB .. 64 MiB


def plot_timing(result) -> Figure:
    """Time (left) and busbw (right) against message size, measured vs the alpha-beta model."""
    fig = Figure(figsize=(9, 3.2), layout="constrained")
    ax_t, ax_bw = fig.subplots(1, 2)
    n = result.nbytes
    ax_t.loglog(n, result.measured * 1e3, "o", color=color("measured"), label="measured")
    ax_t.loglog(n, np.maximum(result.predicted, 1e-9) * 1e3, "-", color=color("predicted"),
                label="predicted")
    ax_t.set(xlabel="message size n [bytes]", ylabel="time [ms]")
    ax_bw.semilogx(n, result.busbw_measured / 1e9, "o-", color=color("measured"), label="measured")
    ax_bw.semilogx(n, result.busbw_predicted / 1e9, "-", color=color("predicted"),
                   label="predicted")
    ax_bw.set(xlabel="message size n [bytes]", ylabel="busbw [GB/s]")
    legend_outside(ax_t)
    fig.suptitle(f"{result.collective} ({result.algorithm}) on {result.p} ranks")
    return fig


class CollectivesPanel(Panel):
    """Controls: collective, algorithm, number of ranks, largest message size; a Run button.

    ``max_ranks``: the largest p offered (None: the runner's or cluster's size). ``alpha`` (s) and
    ``beta`` (s/B) are the fitted link parameters used for predictions; the latest
    :class:`~coursekit.collectives.timing.CollectiveTiming` is ``panel.result``.
    ``panel_options`` (``cluster`` or ``runner``, ``restart``, ``prepare``) go to
    :class:`Panel`.
    """

    def __init__(self, max_ranks: int | None = None, *, alpha: float, beta: float,
                 repeats: int = 3, experiment=measure, **panel_options):
        max_ranks = size_limit("max_ranks", max_ranks, run_target(panel_options))
        self.alpha, self.beta, self.repeats = alpha, beta, repeats
        self.experiment = experiment
        style = {"description_width": "110px"}
        self.collective = widgets.Dropdown(options=list(ALGORITHMS), value="allreduce",
                                           description="collective", style=style)
        self.algorithm = widgets.Dropdown(options=ALGORITHMS["allreduce"],
                                          value=DEFAULT_ALGORITHM["allreduce"],
                                          description="algorithm", style=style)
        self.ranks = widgets.IntSlider(max_ranks, min=1, max=max_ranks, description="ranks",
                                       style=style)
        self.size = widgets.SelectionSlider(options=[(byte_label(s), s) for s in SIZES],
                                            value=1 << 20, description="up to", style=style)
        self.collective.observe(self._collective_changed, names="value")
        super().__init__([self.collective, self.algorithm, self.ranks, self.size],
                         hint="Pick a collective and press Run.", **panel_options)

    def _collective_changed(self, change):
        self.algorithm.options = ALGORITHMS[change["new"]]
        self.algorithm.value = DEFAULT_ALGORITHM[change["new"]]

    def compute(self):
        """Measure with the current settings."""
        p = self.ranks.value
        sizes = [s for s in SIZES if s <= self.size.value]
        return self.experiment(self.runner(), p, self.collective.value, self.algorithm.value,
                               sizes, self.alpha, self.beta, repeats=self.repeats)

    def show(self, r) -> None:
        self.say(f"largest: {r.measured[-1] * 1e3:.3g} ms measured, "
                 f"{r.predicted[-1] * 1e3:.3g} ms predicted")
        self.plot.value = png(plot_timing(r))
