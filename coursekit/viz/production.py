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

__all__ = ["plot_mpi_collectives"]

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
