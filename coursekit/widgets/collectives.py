"""Chapter 2 panel: run a collective on the live ranks, plot measured vs predicted.

Thin by design: Run reads the controls and calls the pure experiment
:func:`coursekit.collectives.timing.measure` through ``make_run(p)``, a callable that
returns a ``run(fn, *args)`` executing ``fn(comm, *args)`` on p ranks (the cluster's, or
:func:`~coursekit.collectives.timing.local_runner` for ThreadComm ranks). The plot is a
PNG in an ``Image`` widget, so the panel prints nothing and works headless (tests set
``panel.collective.value = "bcast"`` and call ``panel.run_button.click()``).
"""

from __future__ import annotations

import io

import ipywidgets as widgets
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from coursekit.collectives import ALGORITHMS, DEFAULT_ALGORITHM
from coursekit.collectives.timing import measure
from coursekit.viz import byte_label, color

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
    ax_t.legend(loc="upper left")
    fig.suptitle(f"{result.collective} ({result.algorithm}) on {result.p} ranks")
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()


class CollectivesPanel(widgets.VBox):
    """Controls: collective, algorithm, number of ranks, largest message size; a Run button.

    ``alpha`` (s) and ``beta`` (s/B) are the fitted link parameters used for predictions;
    the latest :class:`~coursekit.collectives.timing.CollectiveTiming` is ``panel.result``.
    """

    def __init__(self, make_run, max_ranks: int, alpha: float, beta: float, repeats: int = 3,
                 experiment=measure):
        if isinstance(max_ranks, bool) or not isinstance(max_ranks, int) or max_ranks < 1:
            raise ValueError(f"max_ranks must be a positive int, got {max_ranks!r}")
        self.make_run, self.alpha, self.beta, self.repeats = make_run, alpha, beta, repeats
        self.experiment, self.result = experiment, None
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
        self.run_button = widgets.Button(description="Run", button_style="primary", icon="play")
        self.status = widgets.Label("Pick a collective and press Run.")
        self.plot = widgets.Image(format="png")
        self.collective.observe(self._collective_changed, names="value")
        self.run_button.on_click(lambda _: self.run())
        controls = widgets.VBox([self.collective, self.algorithm, self.ranks, self.size])
        super().__init__([controls, widgets.HBox([self.run_button, self.status]), self.plot])

    def _collective_changed(self, change):
        self.algorithm.options = ALGORITHMS[change["new"]]
        self.algorithm.value = DEFAULT_ALGORITHM[change["new"]]

    def run(self):
        """Measure with the current settings, draw, and return the result."""
        p = self.ranks.value
        sizes = [s for s in SIZES if s <= self.size.value]
        self.run_button.disabled = True
        self.status.value = "running ..."
        try:
            self.result = self.experiment(self.make_run(p), p, self.collective.value,
                                          self.algorithm.value, sizes, self.alpha, self.beta,
                                          repeats=self.repeats)
        except ValueError as err:
            self.status.value = f"error: {err}"
            return None
        finally:
            self.run_button.disabled = False
        r = self.result
        self.status.value = (f"largest: {r.measured[-1] * 1e3:.3g} ms measured, "
                             f"{r.predicted[-1] * 1e3:.3g} ms predicted")
        self.plot.value = _png(plot_timing(r))
        return r
