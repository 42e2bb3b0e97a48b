"""Per-rank timelines (Gantt charts) of traced messages.

Each rank is a row; every traced send and recv is a bar from ``t_start`` to ``t_end``
coloured by :mod:`.style`; an arrow joins each send to the recv that matched it (the k-th
send from s to d with tag t matches the k-th recv on d from s with tag t: messages with one
tag never overtake). Extra :class:`~coursekit.parallel.spans.Span` s, such as compute, can be
drawn on the same rows.
"""

from __future__ import annotations

from collections import defaultdict

import matplotlib.pyplot as plt

from coursekit import checks
from coursekit.parallel.spans import Span

from .style import color, legend_outside, time_unit

_BAR = 0.6


def match_messages(traces) -> list[tuple]:
    """Pairs ``(send, recv)`` of Message records, matched in FIFO order per (src, dst, tag)."""
    sends, recvs = defaultdict(list), defaultdict(list)
    for trace in traces:
        for m in trace:
            (sends if m.op == "send" else recvs)[m.src, m.dst, m.tag].append(m)
    return [pair for key in sends for pair in zip(sends[key], recvs.get(key, []))]


def plot_timeline(traces, spans=(), *, ax=None, arrows: bool = True, title: str | None = None,
                  t0: float | None = None):
    """Draw ``traces`` (one list of ``Message`` per rank) as a per-rank timeline.

    ``spans``: extra bars, :class:`~coursekit.parallel.spans.Span` s such as
    ``Span(0, "compute", a, b)``, each on its rank's row.
    ``t0``: the time shown as zero (default: the earliest event). Returns the Figure.
    """
    traces = [list(t) for t in traces]
    if not traces:
        raise ValueError("plot_timeline needs at least one rank's trace")
    spans = [checks.instance(s, "each of spans", Span, " (coursekit.parallel.spans)")
             for s in spans]
    starts = [m.t_start for t in traces for m in t] + [s.start for s in spans]
    ends = [m.t_end for t in traces for m in t] + [s.end for s in spans]
    if t0 is None:
        t0 = min(starts, default=0.0)
    unit, scale = time_unit(max(max(ends, default=t0) - t0, 1e-9))
    fig = ax.figure if ax is not None else plt.figure(figsize=(8, 0.6 * len(traces) + 1.2), layout="constrained")
    ax = ax if ax is not None else fig.add_subplot()

    def bar(rank, kind, a, b):
        ax.broken_barh([((a - t0) * scale, max((b - a) * scale, 1e-3))], (rank - _BAR / 2, _BAR),
                       facecolors=color(kind), edgecolors="none")

    for s in spans:
        bar(s.rank, s.kind, s.start, s.end)
    for rank, trace in enumerate(traces):
        for m in trace:
            bar(rank, m.op, m.t_start, m.t_end)
    if arrows:
        for s, r in match_messages(traces):
            ax.annotate("", xy=((r.t_end - t0) * scale, r.dst), xytext=((s.t_start - t0) * scale, s.src),
                        arrowprops=dict(arrowstyle="->", color=color("message"), lw=0.7,
                                        alpha=0.6, shrinkA=0, shrinkB=0))
    kinds = sorted({s.kind for s in spans} | {m.op for t in traces for m in t})
    handles = [plt.Rectangle((0, 0), 1, 1, color=color(k)) for k in kinds]
    if handles:
        legend_outside(ax, handles=handles, labels=kinds)
    ax.set_yticks(range(len(traces)), [f"rank {r}" for r in range(len(traces))])
    ax.set_ylim(len(traces) - 0.5, -0.5)
    ax.set_xlabel(f"time [{unit}]")
    ax.set_xlim(left=0)
    if title:
        ax.set_title(title)
    if fig.get_layout_engine() is None:  # a caller's figure without a layout of its own
        fig.tight_layout()
    return fig
