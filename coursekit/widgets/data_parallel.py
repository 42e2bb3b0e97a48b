"""Chapter 3: plots of the data-parallel experiments and one control panel.

The plot functions draw results of :mod:`coursekit.parallel.data_parallel.sync_sgd` and
:mod:`coursekit.parallel.data_parallel.experiments`; each returns its Figure (a pyplot figure, or
draws into ``fig`` when given one). :class:`DataParallelPanel` is thin: Run reads the
controls into a :class:`~coursekit.parallel.data_parallel.config.DPConfig`, calls
:func:`~coursekit.parallel.data_parallel.train` on the panel's runner (its cluster's
engines, or a ``runner=LocalRunner(n)``) with ``on_update=``, moves the progress bar and
redraws the loss so far and the latest step's per-rank timeline while the engines train
(:func:`plot_live`), then draws the loss curve and the timeline of the last steps.
Layout, Stop, errors and a lost cluster: :class:`coursekit.widgets.panel.Panel`. Tests
drive it headlessly: ``panel.workers.value = 3``, ``panel.run()``.
"""

from __future__ import annotations

from dataclasses import replace

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from coursekit.collectives import ALGORITHMS
from coursekit.parallel.data_parallel.config import EXCHANGES, DPConfig
from coursekit.parallel.data_parallel import train
from coursekit.parallel.data_parallel.lr_rules import RULES
from coursekit.viz import byte_label, color, legend_outside, plot_timeline, readable_log_ticks, series_color
from coursekit.widgets.panel import LiveRepr, Panel, png, run_target, size_limit

__all__ = ["DataParallelPanel", "LiveView", "live_loss", "plot_exchange_sweep", "plot_live",
           "plot_lr_grid", "plot_run", "plot_scaling", "plot_straggler", "plot_timeline_of"]

# The bucket dropdown: its label -> DPConfig.bucket_bytes (None: the gradient in one piece)
BUCKETS = {"one piece": None, **{byte_label(b): b for b in (8 << 10, 64 << 10, 256 << 10, 1 << 20)}}


def _figure(fig, width, height):
    return fig if fig is not None else plt.figure(figsize=(width, height))


def plot_timeline_of(result, ax=None, title=None):
    """The last traced steps of ``result``: compute spans and messages, one row per rank.

    Waiting ("idle") is drawn first, so the reducer's messages show on top of it.
    """
    spans = sorted(result.spans, key=lambda s: s.kind != "idle")
    return plot_timeline(result.traces, spans, ax=ax, arrows=False, title=title)


def plot_run(result, fig=None):
    """Global batch loss per step (left) and the timeline of the last steps (right)."""
    fig = _figure(fig, 10, 3.4)
    ax_loss, ax_tl = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.6]})
    steps = np.arange(result.first_step, result.first_step + result.loss.size) + 1
    ax_loss.plot(steps, result.loss, color=color("measured"), lw=1)
    ax_loss.set(xlabel="step", ylabel="batch loss", yscale="log")
    readable_log_ticks(ax_loss, "y")
    cfg = result.config
    ax_loss.set_title(f"{cfg.exchange} on {result.n_workers} workers, B={cfg.batch_size}",
                      fontsize="medium")
    plot_timeline_of(result, ax=ax_tl, title=f"last {cfg.timeline_steps} steps")
    fig.tight_layout()
    return fig


def plot_exchange_sweep(sweep, fig=None):
    """Exposed communication per step (left) and bytes through the busiest rank (right)."""
    fig = _figure(fig, 10, 3.4)
    ax_t, ax_b = fig.subplots(1, 2)
    for index, (mode, marker) in enumerate(zip(sweep.comm_per_step, "os^")):
        method = series_color(index)  # one colour per exchange; solid measured, dashed model
        ax_t.plot(sweep.workers, sweep.comm_per_step[mode] * 1e3, marker, ls="-",
                  color=method, label=f"{mode} measured")
        ax_t.plot(sweep.workers, sweep.predicted_comm[mode] * 1e3, marker, ls="--",
                  color=method, mfc="none", label=f"{mode} predicted")
        ax_b.plot(sweep.workers, sweep.busiest_bytes[mode] / 1e6, marker, ls="-",
                  color=method, label=f"{mode} measured")
        ax_b.plot(sweep.workers, sweep.predicted_busiest_bytes[mode] / 1e6, marker, ls="--",
                  color=method, mfc="none", label=f"{mode} predicted")
    ax_t.set(xlabel="workers N", ylabel="communication per step [ms]")
    ax_b.set(xlabel="workers N", ylabel="busiest rank's traffic [MB / step]")
    ax_t.set_xticks(sweep.workers)
    ax_b.set_xticks(sweep.workers)
    legend_outside(ax_b)
    fig.tight_layout()
    return fig


def plot_lr_grid(grid, fig=None):
    """Final test accuracy against the number of workers (B = n * N), one line per rule."""
    fig = _figure(fig, 5.5, 3.4)
    ax = fig.subplots()
    for rule, acc in zip(grid.rules, grid.accuracy):
        ax.plot(grid.workers, acc, "o-", label=rule)
    ax.set(xlabel=f"workers N (global batch = {grid.per_worker_batch} N)",
           ylabel="test accuracy", xscale="log")
    ax.set_xticks(grid.workers, [str(w) for w in grid.workers])
    legend_outside(ax)
    fig.tight_layout()
    return fig


def plot_straggler(sweep, fig=None):
    """Step time, the straggler's compute and the others' compute against the slow factor."""
    fig = _figure(fig, 5.5, 3.4)
    ax = fig.subplots()
    ax.plot(sweep.factors, sweep.time_per_step * 1e3, "o-", color=color("measured"),
            label="time per step (every rank)")
    ax.plot(sweep.factors, sweep.straggler_compute * 1e3, "s--", color=color("compute"),
            label="straggler's compute")
    ax.plot(sweep.factors, sweep.others_compute * 1e3, "^:", color=color("compute"), mfc="none",
            label="others' compute")
    ax.set(xlabel="straggler slow factor [x]", ylabel="time per step [ms]")
    legend_outside(ax)
    fig.tight_layout()
    return fig


def plot_scaling(s, fig=None):
    """Step time split into compute and communication (bars), and efficiency vs the model."""
    fig = _figure(fig, 10, 3.4)
    ax_t, ax_e = fig.subplots(1, 2)
    x = np.arange(len(s.workers))
    ax_t.bar(x, s.compute * 1e3, color=color("compute"), label="compute")
    ax_t.bar(x, s.comm * 1e3, bottom=s.compute * 1e3, color=color("comm"), label="communication")
    ax_t.plot(x, s.predicted_step * 1e3, "D", color=color("predicted"), label="predicted step")
    ax_t.set_xticks(x, [str(w) for w in s.workers])
    ax_t.set(xlabel="workers N", ylabel="time per step [ms]")
    legend_outside(ax_t)
    ax_e.plot(s.workers, s.efficiency, "o-", color=color("measured"), label="measured")
    ax_e.plot(s.workers, s.predicted_efficiency, "D--", color=color("predicted"),
              label="cost model")
    ax_e.set(xlabel="workers N", ylabel="weak-scaling efficiency T1/TN", ylim=(0, 1.1))
    ax_e.set_xticks(s.workers)
    legend_outside(ax_e)
    fig.tight_layout()
    return fig


def live_loss(data) -> np.ndarray:
    """The global batch loss sum_k w_k loss_k from the ranks' published series, for the
    steps every rank has published so far."""
    steps = min((len(d.get("loss", ())) for d in data), default=0)
    loss = np.array([d.get("loss", [])[:steps] for d in data], float).reshape(len(data), steps)
    weight = np.array([d.get("weight", [])[:steps] for d in data], float).reshape(len(data), steps)
    return np.where(weight > 0, weight * loss, 0.0).sum(axis=0)


def plot_live(data) -> Figure:
    """From the ranks' streamed data: the global batch loss so far (left) and the latest
    step's compute / communication spans of every rank (right)."""
    loss = live_loss(data)
    fig = Figure(figsize=(10, 3), layout="constrained")
    ax_loss, ax_tl = fig.subplots(1, 2, width_ratios=[1, 1.6])
    ax_loss.plot(np.arange(1, loss.size + 1), loss, color=color("measured"), lw=1)
    ax_loss.set(xlabel="step", ylabel="batch loss")
    spans = sorted((s for d in data for s in d.get("spans", ())), key=lambda s: s.kind != "idle")
    if spans:
        plot_timeline([[] for _ in data], spans, ax=ax_tl, title="latest step")
    else:
        ax_tl.set_axis_off()
    return fig


def live_label(data) -> str:
    """'step 12, test accuracy 0.914' from the ranks' streamed data."""
    evals = data[0].get("evals") or []
    acc = f", test accuracy {evals[-1][1]:.3f}" if evals else ""
    return f"step {min(d.get('step', 0) for d in data)}{acc}"


class LiveView(LiveRepr, widgets.VBox):
    """``on_update`` for :func:`coursekit.live.follow`: :func:`plot_live` and a label,
    redrawn as the data arrive."""

    def __init__(self):
        self.image = widgets.Image(format="png")
        self.label = widgets.Label("waiting for the first update ...")
        super().__init__([self.label, self.image])

    def update(self, data) -> None:
        self.label.value = live_label(data)
        self.image.value = png(plot_live(data))


class DataParallelPanel(Panel):
    """Controls for one run: workers, exchange, algorithm, LR rule, per-worker batch,
    straggler factor, bucket size; Run / Stop, a live progress bar, loss + timeline.

    Trains on ``data`` (evaluated on ``eval_data``) with :func:`train`; ``max_workers``
    (None: the runner's or cluster's size); ``base`` holds every other setting;
    ``panel_options`` (``cluster`` or ``runner``, ``restart``, ``prepare``) go to
    :class:`Panel`. The latest result is ``panel.result``.
    """

    def __init__(self, max_workers: int | None = None, base: DPConfig | None = None,
                 *, data, eval_data=None, **panel_options):
        max_workers = size_limit("max_workers", max_workers, run_target(panel_options))
        self.data, self.eval_data = data, eval_data
        self.base = base or DPConfig()
        style = {"description_width": "120px"}
        self.workers = widgets.IntSlider(max_workers, min=1, max=max_workers,
                                         description="workers", style=style)
        self.exchange = widgets.Dropdown(options=EXCHANGES, value="allreduce",
                                         description="exchange", style=style)
        self.algorithm = widgets.Dropdown(options=ALGORITHMS["allreduce"], value="ring",
                                          description="algorithm", style=style)
        self.lr_rule = widgets.Dropdown(options=RULES, value="linear", description="LR rule",
                                        style=style)
        self.batch = widgets.IntSlider(32, min=1, max=128, description="batch / worker",
                                       style=style)
        self.slow = widgets.FloatSlider(1.0, min=1.0, max=8.0, step=0.5,
                                        description="straggler x", style=style)
        self.bucket = widgets.Dropdown(options=list(BUCKETS), value="one piece",
                                       description="bucket", style=style)
        super().__init__([self.workers, self.exchange, self.algorithm, self.lr_rule,
                          self.batch, self.slow, self.bucket], columns=2, **panel_options)

    def config(self) -> DPConfig:
        """The settings the controls describe (ValueError for an impossible combination)."""
        n = self.workers.value
        return replace(self.base, exchange=self.exchange.value, algorithm=self.algorithm.value,
                       lr_rule=self.lr_rule.value, batch_size=self.batch.value * n,
                       straggler_rank=0 if self.slow.value > 1 else None,
                       slow_factor=self.slow.value,
                       bucket_bytes=BUCKETS[self.bucket.value]
                       if self.exchange.value == "allreduce" else None)

    def compute(self):
        """Train with the current settings, following the workers live."""
        return train(self.runner(), self.config(), self.data, self.eval_data,
                     workers=self.workers.value, on_update=self.on_data)

    def draw_live(self, data) -> None:
        self.say(f"running: {live_label(data)}")
        self.plot.value = png(plot_live(data))

    def show(self, r) -> None:
        self.say(f"{r.step_breakdown()}; final loss {r.loss[-1]:.3f}")
        self.plot.value = png(plot_run(r, fig=Figure(figsize=(10, 3.4))))
