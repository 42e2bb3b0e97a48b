"""Chapter 4 panel: train on the parameter server with the consistency model the controls pick.

Thin by design: Run builds a :class:`~coursekit.parallel.param_server.config.PSConfig` from the
controls, runs it with :func:`~coursekit.parallel.param_server.train` on the panel's runner (its
cluster's engines, or a ``runner=LocalRunner(n)``) and follows the workers' live progress
(:mod:`coursekit.live`): the accuracy curves grow while
the run goes. At the end it draws accuracy against wall-clock time and against gradients
applied (every run so far, to compare), the staleness histogram and per-worker time.
Layout, Run / Stop, errors and a lost cluster: :class:`coursekit.widgets.panel.Panel`;
nothing is printed, everything works headless (tests set ``panel.model.value = "asp"``
and call ``panel.run()``).
"""

from __future__ import annotations

import dataclasses

import ipywidgets as widgets
import numpy as np
from matplotlib.figure import Figure

from coursekit.parallel.param_server import train
from coursekit.parallel.param_server.config import PSConfig
from coursekit.viz import color, integer_ticks, legend_outside, plot_timeline
from coursekit.widgets.panel import Panel, hide_when_empty, png, run_target, size_limit

__all__ = ["ParamServerPanel", "label", "plot_live", "plot_runs", "plot_worker_timeline"]


def label(config: PSConfig) -> str:
    """'SSP s=2, 3 workers, 1 server, straggler 5 ms' for legends."""
    name = f"SSP s={config.staleness}" if config.model == "ssp" else config.model.upper()
    slow = max(config.straggler.values(), default=0.0)
    plural = lambda n, what: f"{n} {what}{'s' if n != 1 else ''}"  # noqa: E731
    return (f"{name}, {plural(config.n_workers, 'worker')}, {plural(config.n_servers, 'server')}"
            + (f", straggler {slow * 1e3:g} ms" if slow else ""))


LIVE_MIN_SPAN_S = 0.05


def plot_live(data: list[dict], title: str = "") -> Figure:
    """Accuracy against time of every worker, from the live data (one dict per rank)."""
    fig = Figure(figsize=(5, 2.8), layout="constrained")
    ax = fig.subplots()
    latest = 0.0
    for d in data:
        if d.get("t"):
            ax.plot(d["t"], d["accuracy"], ".-", ms=3, label=f"worker {d['worker']}")
            latest = max(latest, max(d["t"]))
    # from 0, and never narrower than LIVE_MIN_SPAN_S: the first update has one point at
    # ~0.6 ms, whose automatic limits give a dozen 7-digit tick labels on top of each other
    ax.set(xlabel="wall-clock time [s]", ylabel="test accuracy", ylim=(0, 1), title=title,
           xlim=(0, max(1.05 * latest, LIVE_MIN_SPAN_S)))
    if ax.lines:
        legend_outside(ax)
    return fig


def plot_runs(results: list, fig: Figure | None = None) -> Figure:
    """Accuracy vs time and vs gradients applied (all runs); staleness and worker time (last).

    Draws into ``fig`` when given (e.g. ``plt.figure(figsize=(10, 5), layout="constrained")``
    in a notebook), else into a new headless Figure.
    """
    fig = fig or Figure(figsize=(10, 5), layout="constrained")
    (ax_t, ax_u), (ax_s, ax_w) = fig.subplots(2, 2)
    for r in results:
        t, applied, acc = r.curve()
        ax_t.plot(t, acc, ".-", ms=3, label=label(r.config))
        ax_u.plot(applied, acc, ".-", ms=3, label=label(r.config))
    ax_t.set(xlabel="wall-clock time [s]", ylabel="test accuracy", ylim=(0, 1))
    ax_u.set(xlabel="mini-batch gradients applied", ylabel="test accuracy", ylim=(0, 1))
    # one legend for both top plots, above them: the runs' labels are long
    fig.legend(*ax_t.get_legend_handles_labels(), loc="outside upper center",
               ncols=min(len(results), 3), fontsize=8, frameon=False)
    last = results[-1]
    stale = last.staleness
    ax_s.bar(*np.unique(stale, return_counts=True), color=color("predicted"))
    ax_s.set(xlabel="staleness [versions]", ylabel="applied gradients", title="staleness (last run)")
    integer_ticks(ax_s, "xy")
    workers = [w for w in last.workers if w is not None]
    x = np.array([w.worker for w in workers])
    bottom = np.zeros(len(workers))
    for kind, attr in (("compute", "compute_s"), ("send", "send_s"), ("idle", "idle_s")):
        values = np.array([getattr(w, attr) for w in workers])
        ax_w.bar(x, values, bottom=bottom, color=color(kind), label=kind)
        bottom += values
    for d in last.lost:
        ax_w.annotate(f"lost at {d['t']:.1f} s", (d["worker"], 0), ha="center", va="bottom")
    ax_w.set(xlabel="worker", ylabel="time [s]", xticks=range(last.config.n_workers),
             title="where each worker's time went (last run)")
    legend_outside(ax_w)
    return fig


def plot_worker_timeline(result, title: str | None = None):
    """Every worker's compute / send / idle spans as a timeline (one row per worker)."""
    workers = [w for w in result.workers if w is not None]
    spans = [s._replace(rank=row) for row, w in enumerate(workers) for s in w.spans]
    fig = plot_timeline([[] for _ in workers], spans, arrows=False, t0=0.0,
                        title=title or label(result.config))
    fig.axes[0].set_yticks(range(len(workers)), [f"worker {w.worker}" for w in workers])
    return fig


class ParamServerPanel(Panel):
    """Controls: consistency model, staleness bound, workers, servers, straggler delay; Run.

    ``max_ranks`` bounds servers + workers (None: the runner's or cluster's size); ``base``
    holds every other setting (steps, lr ...); ``data``: the Dataset (None: the digits);
    ``panel_options`` (``cluster`` or ``runner``, ``restart``, ``prepare``) go to
    :class:`Panel`. ``panel.results`` keeps every finished run; ``panel.live`` shows
    each worker's accuracy while a run goes.
    """

    def __init__(self, max_ranks: int | None = None, base: PSConfig | None = None, *,
                 data=None, **panel_options):
        # a server and a worker at least
        max_ranks = size_limit("max_ranks", max_ranks, run_target(panel_options), minimum=2)
        self.data = data
        self.max_ranks = max_ranks
        self.base = base or PSConfig(steps=100, eval_every=10, worker_timeout=2.0)
        style = {"description_width": "130px"}
        self.model = widgets.ToggleButtons(options=[("BSP", "bsp"), ("SSP", "ssp"), ("ASP", "asp")],
                                           value="ssp", description="consistency", style=style)
        self.staleness = widgets.IntSlider(2, min=0, max=10, description="staleness s", style=style)
        self.workers = widgets.IntSlider(max_ranks - 1, min=1, max=max_ranks - 1,
                                         description="workers", style=style)
        self.servers = widgets.IntSlider(1, min=1, max=max_ranks - 1, description="server shards",
                                         style=style)
        self.delay = widgets.FloatSlider(0.0, min=0.0, max=20.0, step=1.0, readout_format=".0f",
                                         description="straggler [ms]", style=style)
        self.live = hide_when_empty(widgets.Image(format="png"))
        self.model.observe(lambda _: self._sync_controls(), names="value")
        self._sync_controls()
        super().__init__([self.model, self.staleness, self.workers, self.servers, self.delay],
                         keep_runs=True, outputs=[self.live],
                         hint="Pick a consistency model and press Run.", **panel_options)

    def _sync_controls(self) -> None:
        self.staleness.disabled = self.model.value != "ssp"

    def config(self) -> PSConfig:
        """The PSConfig the controls describe (ValueError if they do not fit)."""
        if self.workers.value + self.servers.value > self.max_ranks:
            raise ValueError(f"{self.servers.value} server(s) + {self.workers.value} worker(s) "
                             f"need more than the {self.max_ranks} ranks available")
        delay = self.delay.value / 1e3
        return dataclasses.replace(
            self.base, model=self.model.value, n_workers=self.workers.value,
            n_servers=self.servers.value,
            staleness=self.staleness.value if self.model.value == "ssp" else 0,
            straggler={self.workers.value - 1: delay} if delay else {})

    def compute(self):
        """Run with the current settings, following the workers live."""
        config = self.config()
        self.say(f"running {label(config)} ...")
        return train(self.runner(), config, self.data, on_update=self.on_data)

    def draw_live(self, data: list[dict]) -> None:
        title = "live: accuracy of the weights each worker pulled"
        self.live.value = png(plot_live(data, title))

    def show(self, result) -> None:
        self.say(f"{label(result.config)}: {result.applied} gradients in {result.wall_s:.2f} s, "
                 f"max staleness {result.staleness.max(initial=0)}")
        self.live.value = b""  # the comparison below has every run's curves: keep it in view
        self.plot.value = png(plot_runs(self.results))
