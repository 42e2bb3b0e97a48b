"""Chapter 9's pictures: the production libraries beside the course's implementations.

:func:`plot_mpi_collectives` draws :class:`coursekit.production.mpi_collectives.MpiCollectivesResult`\\ s:
one row per result (p ranks), one panel per collective, the bus bandwidth
busbw = (n / t) x the collective's bus factor (nccl-tests' definition) against the message
size n for MPI's own call and each course algorithm over each course Comm. A colour is an
algorithm (MPI's call is one), a line style a transport: solid for MPI's call and for the
course over MpiComm, dashed for the course over ZmqComm; markers tell the library from the
course.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from .style import byte_label, series_color

__all__ = ["plot_mpi_collectives", "plot_side_by_side"]

_LOOK = {"MPI": ("-", "o"), "MpiComm": ("-", "s"), "ZmqComm": ("--", "^")}


def plot_mpi_collectives(results, fig: Figure | None = None) -> Figure:
    """busbw against n, a row per result and a panel per collective, into ``fig`` (default:
    a new headless Figure, at most 10 x 7.5 in); returns the Figure."""
    results = list(results)
    collectives = results[0].config.collectives
    fig = fig or Figure(figsize=(10, 1.4 + 2.4 * len(results)), layout="constrained")
    axes = fig.subplots(len(results), len(collectives), squeeze=False)
    names = []  # implementations in order of appearance: one colour each, in every panel
    handles = {}
    for row, result in zip(axes, results):
        for ax, collective in zip(row, collectives):
            for m in result.of(collective):
                if m.implementation not in names:
                    names.append(m.implementation)
                style, marker = _LOOK[m.transport]
                label = m.label if not m.library else "MPI's own call"
                (line,) = ax.loglog(result.nbytes, m.busbw / 1e9, linestyle=style, marker=marker,
                                    color=series_color(names.index(m.implementation)),
                                    markersize=4, label=label)
                handles.setdefault(label, line)
            ax.set_title(f"{collective}, p = {result.p}", fontsize=9)
            ax.set_xlabel("n [bytes]", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.set_xticks(result.nbytes, [byte_label(n) for n in result.nbytes])
            ax.xaxis.set_minor_locator(NullLocator())
        row[0].set_ylabel("busbw [GB/s]")
    # below the panels, so that they get the figure's whole width for their size labels
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncols=4,
               fontsize=8, frameon=False)
    return fig


def plot_side_by_side(rows, fig: Figure | None = None) -> Figure:
    """:class:`coursekit.production.side_by_side.SideBySide` rows as paired bars: time per step
    (left) and bytes per rank per step (right), the course's beside torch's, one pair per
    row (one run of the panel)."""
    import numpy as np

    rows = list(rows)
    fig = fig or Figure(figsize=(10, 3.6), layout="constrained")
    ax_time, ax_bytes = fig.subplots(1, 2)
    x = np.arange(len(rows))
    labels = [f"{i + 1}: {r.experiment.split(' vs ')[0]}, p={r.workers}" for i, r in enumerate(rows)]
    for ax, course, torch, unit in (
            (ax_time, [r.course_ms for r in rows], [r.library_ms for r in rows], "time per step [ms]"),
            (ax_bytes, [r.course_bytes / 1e3 for r in rows], [r.library_bytes / 1e3 for r in rows],
             "bytes per rank per step [kB]")):
        ax.bar(x - 0.2, course, 0.4, color=series_color(0), label="coursekit")
        ax.bar(x + 0.2, torch, 0.4, color=series_color(1), label="torch")
        ax.set_ylabel(unit, fontsize=9)
        ax.set_xticks(x, [str(i + 1) for i in x], fontsize=8)
        ax.set_xlabel("run", fontsize=9)
        ax.tick_params(labelsize=8)
    ax_time.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.25), ncols=2, frameon=False)
    fig.suptitle("; ".join(labels[-3:]), fontsize=8)
    return fig
