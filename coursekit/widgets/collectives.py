"""Chapter 2 panel: run a collective on the live ranks, plot measured vs predicted.

Thin by design: Run reads the controls and calls the pure experiment
:func:`coursekit.collectives.timing.measure_and_predict` on the panel's runner: the engines of its
cluster, or a ``runner=LocalRunner(n)`` (ThreadComm ranks). The plot is a PNG of
:func:`coursekit.viz.collectives.plot_timing`; layout, Run / Stop, errors and a lost
cluster are handled by :class:`coursekit.widgets.panel.Panel` (tests set ``panel.collective.value = "bcast"`` and
call ``panel.run()``).
"""

from __future__ import annotations

import ipywidgets as widgets

from coursekit.collectives import ALGORITHMS, DEFAULT_ALGORITHM
from coursekit.collectives.timing import TimingConfig, measure_and_predict
from coursekit.costmodel import check_link
from coursekit.viz import byte_label
from coursekit.viz.collectives import plot_timing
from coursekit.widgets.panel import Panel, png, run_target, size_limit
from coursekit.widgets.transport import control_for

__all__ = ["CollectivesPanel"]

SIZES = tuple(1 << k for k in range(10, 27, 2))  # 1 KiB .. 64 MiB


class CollectivesPanel(Panel):
    """Controls: collective, algorithm, number of ranks, largest message size, and on a
    cluster the transport (:mod:`coursekit.widgets.transport`); a Run button.

    ``max_ranks``: the largest p offered (None: the runner's or cluster's size). ``link``: the
    fitted link the predictions use, anything with ``.alpha`` (s) and ``.beta`` (s/B)
    (``measure.link(runner)``, or a :class:`~coursekit.costmodel.LinkFit`), passed on to
    ``experiment`` (:func:`~coursekit.collectives.timing.measure_and_predict`); the latest
    :class:`~coursekit.collectives.timing.CollectiveTiming` is ``panel.result``.
    ``panel_options`` (``cluster`` or ``runner``, ``restart``, ``prepare``) go to
    :class:`Panel`.
    """

    def __init__(self, max_ranks: int | None = None, *, link, repeats: int = 3,
                 experiment=measure_and_predict, **panel_options):
        max_ranks = size_limit("max_ranks", max_ranks, run_target(panel_options))
        check_link(link)
        self.link, self.repeats = link, repeats
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
        self.transport = control_for(panel_options, style)
        extra = [self.transport.dropdown] if self.transport else []
        super().__init__([self.collective, self.algorithm, self.ranks, self.size, *extra],
                         hint="Pick a collective and press Run.", **panel_options)

    def _collective_changed(self, change):
        self.algorithm.options = ALGORITHMS[change["new"]]
        self.algorithm.value = DEFAULT_ALGORITHM[change["new"]]

    def compute(self):
        """Measure with the current settings."""
        sizes = [s for s in SIZES if s <= self.size.value]
        config = TimingConfig(self.collective.value, self.algorithm.value, sizes, self.repeats)
        if self.transport:
            self.transport.apply(self.cluster)
        return self.experiment(self.runner(), config, self.link, workers=self.ranks.value)

    def show(self, r) -> None:
        self.say(f"largest: {r.measured[-1] * 1e3:.3g} ms measured, "
                 f"{r.predicted[-1] * 1e3:.3g} ms predicted")
        self.plot.value = png(plot_timing(r))
