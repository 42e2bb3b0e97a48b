"""Chapter 4's pictures: parameter-server runs under BSP, SSP and ASP.

:func:`plot_live` draws each worker's test accuracy against wall-clock time while a run
goes (from the streamed data of :mod:`coursekit.cluster.live`); :func:`plot_runs` compares
finished runs (a :class:`~coursekit.parallel.param_server.results.PSResult` each) by
accuracy against time and against gradients applied, with the last run's staleness
histogram and where each worker's time went; :func:`plot_worker_timeline` draws one run's
compute / send / idle spans, one row per worker. :func:`label` names a run in legends.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from .bars import stacked_bars
from .style import color, integer_ticks, legend_outside
from .timeline import plot_timeline

__all__ = ["MIN_TIME_SPAN_S", "label", "plot_live", "plot_runs", "plot_worker_timeline"]

MIN_TIME_SPAN_S = 0.05
"""The wall-clock axes (live and finished runs) are never narrower than this (s)."""


def _time_axis(ax, latest: float) -> None:
    """Wall-clock x axis from 0 to ``latest`` (s), never narrower than MIN_TIME_SPAN_S, with
    at most 6 ticks at steps of 1, 2 or 5 times a power of ten: automatic limits and ticks
    put a dozen 7-digit labels on top of each other for a first update at ~0.6 ms, and eight
    0.0025 s steps ('0.0000', '0.0025', ...) on a run of 0.02 s."""
    from matplotlib.ticker import MaxNLocator
    ax.set_xlim(0, max(1.05 * latest, MIN_TIME_SPAN_S))
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 5, 10]))


def label(config, topology) -> str:
    """'SSP s=2, 3 workers, 1 server, straggler 5 ms, slow server 30 ms' for legends (``config``: a PSConfig,
    ``topology``: the PSTopology it runs on); ', lr 0.3' where the learning rate is not the
    default."""
    name = f"SSP s={config.staleness}" if config.model == "ssp" else config.model.upper()
    slow = max(config.straggler.values(), default=0.0)
    slow_server = max(config.server_delay.values(), default=0.0)
    plural = lambda n, what: f"{n} {what}{'s' if n != 1 else ''}"  # noqa: E731
    return (f"{name}, {plural(topology.workers, 'worker')}, {plural(topology.servers, 'server')}"
            + (f", straggler {slow * 1e3:g} ms" if slow else "")
            + (f", slow server {slow_server * 1e3:g} ms" if slow_server else "")
            + (f", lr {config.lr:.3g}" if config.lr != type(config).__dataclass_fields__["lr"].default
               else ""))


def plot_live(data: list[dict], title: str = "", fig: Figure | None = None) -> Figure:
    """Accuracy against time of every worker, from the live data (one dict per rank),
    drawn into ``fig`` (default: a new headless 5 x 2.8 in Figure)."""
    fig = fig or Figure(figsize=(5, 2.8), layout="constrained")
    ax = fig.subplots()
    latest = 0.0
    for d in data:
        if d.get("t"):
            ax.plot(d["t"], d["accuracy"], ".-", ms=3, label=f"worker {d['worker']}")
            latest = max(latest, max(d["t"]))
    ax.set(xlabel="wall-clock time [s]", ylabel="test accuracy", ylim=(0, 1), title=title)
    _time_axis(ax, latest)
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
    latest = 0.0
    for r in results:
        t, applied, acc = r.curve()
        ax_t.plot(t, acc, ".-", ms=3, label=label(r.config, r.topology))
        ax_u.plot(applied, acc, ".-", ms=3, label=label(r.config, r.topology))
        latest = max(latest, t.max(initial=0.0))
    ax_t.set(xlabel="wall-clock time [s]", ylabel="test accuracy", ylim=(0, 1))
    _time_axis(ax_t, latest)
    ax_u.set(xlabel="mini-batch gradients applied", ylabel="test accuracy", ylim=(0, 1))
    # one legend for both top plots, above them: the runs' labels are long
    fig.legend(*ax_t.get_legend_handles_labels(), loc="outside upper center",
               ncols=min(len(results), 3), fontsize=8, frameon=False)
    last = results[-1]
    ax_s.bar(*last.staleness_histogram(), color=color("predicted"))  # every gradient
    ax_s.set(xlabel="staleness [versions]", ylabel="applied gradients", title="staleness (last run)")
    integer_ticks(ax_s, "xy")
    workers = [w for w in last.workers if w is not None]
    stacked_bars(ax_w, [w.worker for w in workers],
                 [(kind, [getattr(w, attr) for w in workers], color(kind))
                  for kind, attr in (("compute", "compute_s"), ("send", "send_s"), ("idle", "idle_s"))])
    for d in last.lost:
        ax_w.annotate(f"lost at {d['t']:.1f} s", (d["worker"], 0), ha="center", va="bottom")
    ax_w.set(xlabel="worker", ylabel="time [s]", xticks=range(last.topology.workers),
             title="where each worker's time went (last run)")
    legend_outside(ax_w)
    return fig


def plot_worker_timeline(result, title: str | None = None, ax=None):
    """Every worker's compute / send / idle spans as a timeline (one row per worker), on
    ``ax`` (default: a new pyplot figure); returns the Figure."""
    workers = [w for w in result.workers if w is not None]
    spans = [s._replace(rank=row) for row, w in enumerate(workers) for s in w.spans]
    fig = plot_timeline([[] for _ in workers], spans, ax=ax, arrows=False, t0=0.0,
                        title=title or label(result.config, result.topology))
    (ax or fig.axes[0]).set_yticks(range(len(workers)), [f"worker {w.worker}" for w in workers])
    return fig
