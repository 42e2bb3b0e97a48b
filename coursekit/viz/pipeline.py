"""Draw a pipeline schedule's per-rank timeline (simulated or measured).

Bars use the course colours (:mod:`.style`), one per action letter
(:mod:`coursekit.parallel.pipeline.actions`): F "forward", B "backward" (the full
backward), I "input_grad" and W "weight_grad" (the two halves of a split backward; W
hatched, so it reads in grey too); each bar is labelled with its micro-batch; chunks of
an interleaved schedule get lighter shades (chunk c of v at opacity 1 - c/(2v)); the bubble
shows as "idle" behind the bars.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from .style import color

_BAR = 0.7
_STYLE = {"F": ("forward", None), "B": ("backward", None), "I": ("input_grad", None),
          "W": ("weight_grad", "///")}
_LABEL = {"F": "forward F", "B": "full backward B", "I": "input grad I", "W": "weight grad W"}


def plot_schedule(timeline, *, ax=None, title: str | None = None, unit: str = "time units",
                  labels: bool = True):
    """Draw ``timeline`` (``timeline[r]`` = rank r's Spans, e.g. ``simulate(...).timeline`` or
    ``run_pipeline(...).timeline``) as a Gantt chart. ``unit`` labels the time axis ("ms"
    for measured runs; simulated times are in units of T_F). Returns the Figure."""
    timeline = [list(spans) for spans in timeline]
    if not timeline:
        raise ValueError("plot_schedule needs at least one rank's timeline")
    p = len(timeline)
    v = 1 + max((s.action.stage // p for spans in timeline for s in spans), default=0)
    end = max((s.end for spans in timeline for s in spans), default=1.0)
    fig = ax.figure if ax is not None else plt.figure(figsize=(10, 0.55 * p + 1.3))
    ax = ax if ax is not None else fig.add_subplot()
    for r, spans in enumerate(timeline):
        ax.barh(r, end, height=_BAR, color=color("idle"), zorder=0)  # the bubble, under the bars
        for s in spans:
            kind, hatch = _STYLE[s.action.kind]
            chunk = s.action.stage // p
            ax.broken_barh([(s.start, s.end - s.start)], (r - _BAR / 2, _BAR),
                           facecolors=color(kind), alpha=1 - chunk / (2 * v), hatch=hatch,
                           edgecolors="white", linewidth=0.5)
            if labels and s.end - s.start > end / 150:
                ax.text((s.start + s.end) / 2, r, str(s.action.mb), ha="center", va="center",
                        fontsize=7, color="white")
    kinds = sorted({s.action.kind for spans in timeline for s in spans}, key=list(_STYLE).index)
    ax.legend([Patch(facecolor=color(_STYLE[k][0]), hatch=_STYLE[k][1]) for k in kinds]
              + [Patch(facecolor=color("idle"))], [_LABEL[k] for k in kinds] + ["idle (bubble)"],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_xlim(0, end)
    ax.set_xlabel(f"time [{unit}]")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
