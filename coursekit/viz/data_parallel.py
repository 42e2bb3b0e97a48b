"""Chapter 3's pictures: data-parallel runs and the sweeps of :mod:`coursekit.parallel.data_parallel`.

Each function draws a result of :mod:`~coursekit.parallel.data_parallel.sync_sgd` or
:mod:`~coursekit.parallel.data_parallel.experiments` and returns its Figure: it draws into
``fig`` when given one, else into a new pyplot figure (a notebook shows it).
:func:`plot_live` draws the ranks' streamed data (:mod:`coursekit.cluster.live`) while a run goes.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from .bars import stacked_bars
from .style import color, legend_outside, readable_log_ticks, series_color
from .timeline import plot_timeline

__all__ = ["live_loss", "plot_exchange_sweep", "plot_live", "plot_lr_grid", "plot_run",
           "plot_scaling", "plot_straggler", "plot_timeline_of"]


def _figure(fig, width, height):
    return fig if fig is not None else plt.figure(figsize=(width, height))


def _finish(fig, *legend_axes):
    """Legends outside ``legend_axes``, the layout tightened: the figure, ready to return."""
    for ax in legend_axes:
        legend_outside(ax)
    fig.tight_layout()
    return fig


def _idle_first(spans) -> list:
    """Waiting ("idle") spans first, so the bars drawn after them show on top."""
    return sorted(spans, key=lambda s: s.kind != "idle")


def _draw_loss(ax, steps, loss) -> None:
    ax.plot(steps, loss, color=color("measured"), lw=1)
    ax.set(xlabel="step", ylabel="batch loss")


def plot_timeline_of(result, ax=None, title=None):
    """The last traced steps of ``result``: compute spans and messages, one row per rank.

    Waiting ("idle") is drawn first, so the reducer's messages show on top of it.
    """
    return plot_timeline(result.traces, _idle_first(result.spans), ax=ax, arrows=False, title=title)


def plot_run(result, fig=None):
    """Global batch loss per step (left, log scale) and the timeline of the last steps (right)."""
    fig = _figure(fig, 10, 3.4)
    ax_loss, ax_tl = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.6]})
    _draw_loss(ax_loss, np.arange(result.first_step, result.first_step + result.loss.size) + 1,
               result.loss)
    ax_loss.set_yscale("log")
    readable_log_ticks(ax_loss, "y", decimals=True)
    cfg = result.config
    ax_loss.set_title(f"{cfg.exchange} on {result.n_workers} workers, B={cfg.batch_size}",
                      fontsize="medium")
    plot_timeline_of(result, ax=ax_tl, title=f"last {cfg.timeline_steps} steps")
    return _finish(fig)


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
    return _finish(fig, ax_b)


def plot_lr_grid(grid, fig=None):
    """Final test accuracy against the number of workers (B = n * N), one line per rule."""
    fig = _figure(fig, 5.5, 3.4)
    ax = fig.subplots()
    for rule, acc in zip(grid.rules, grid.accuracy):
        ax.plot(grid.workers, acc, "o-", label=rule)
    ax.set(xlabel=f"workers N (global batch = {grid.per_worker_batch} N)",
           ylabel="test accuracy", xscale="log")
    ax.set_xticks(grid.workers, [str(w) for w in grid.workers])
    return _finish(fig, ax)


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
    return _finish(fig, ax)


def plot_scaling(s, fig=None):
    """Step time split into compute, staging (GPU runs) and communication (stacked bars,
    the model's step as a diamond) and the weak-scaling efficiency T1/TN against the cost
    model's."""
    fig = _figure(fig, 10, 3.4)
    ax_t, ax_e = fig.subplots(1, 2)
    x = np.arange(len(s.workers))
    staged = [("stage", s.stage * 1e3, color("stage"))] if s.stage.any() else []  # GPU runs
    stacked_bars(ax_t, x, [("compute", s.compute * 1e3, color("compute")), *staged,
                           ("communication", s.comm * 1e3, color("comm"))])
    ax_t.plot(x, s.predicted_step * 1e3, "D", color=color("predicted"), label="predicted step")
    ax_t.set_xticks(x, [str(w) for w in s.workers])
    ax_t.set(xlabel="workers N", ylabel="time per step [ms]")
    ax_e.plot(s.workers, s.efficiency, "o-", color=color("measured"), label="measured")
    ax_e.plot(s.workers, s.predicted_efficiency, "D--", color=color("predicted"),
              label="cost model")
    ax_e.set(xlabel="workers N", ylabel="weak-scaling efficiency T1/TN", ylim=(0, 1.1))
    ax_e.set_xticks(s.workers)
    return _finish(fig, ax_t, ax_e)


def live_loss(data) -> np.ndarray:
    """The global batch loss sum_k w_k loss_k from the ranks' published series, for the
    steps every rank has published so far."""
    steps = min((len(d.get("loss", ())) for d in data), default=0)
    loss = np.array([d.get("loss", [])[:steps] for d in data], float).reshape(len(data), steps)
    weight = np.array([d.get("weight", [])[:steps] for d in data], float).reshape(len(data), steps)
    return np.where(weight > 0, weight * loss, 0.0).sum(axis=0)


def plot_live(data, fig: Figure | None = None) -> Figure:
    """From the ranks' streamed data: the global batch loss so far (left, :func:`live_loss`)
    and the latest step's compute / communication spans of every rank (right), drawn
    into ``fig`` (default: a new headless 10 x 3 in Figure)."""
    loss = live_loss(data)
    fig = fig or Figure(figsize=(10, 3), layout="constrained")
    ax_loss, ax_tl = fig.subplots(1, 2, width_ratios=[1, 1.6])
    _draw_loss(ax_loss, np.arange(1, loss.size + 1), loss)
    spans = _idle_first(s for d in data for s in d.get("spans", ()))
    if spans:
        plot_timeline([[] for _ in data], spans, ax=ax_tl, title="latest step")
    else:
        ax_tl.set_axis_off()
    return fig
