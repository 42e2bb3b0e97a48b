"""Chapter 8's picture: the bytes per GPU of every ZeRO stage against the GPU's memory.

:func:`plot_memory` stacks, for ZeRO stages 0 to 3, the parameters, gradients, optimizer
states and activations one GPU holds (a :class:`coursekit.memory.MemoryBreakdown` each),
outlines the chosen stage and draws the GPU's capacity as a dashed line: a stage fits
where its bar ends below the line.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from .bars import stacked_bars
from .style import legend_outside, series_color

__all__ = ["CATEGORIES", "plot_memory"]

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations")
"""The parts of a MemoryBreakdown, bottom to top."""


def plot_memory(breakdowns: list, chosen: int, gpu_bytes: float, title: str,
                fig: Figure | None = None) -> Figure:
    """One stacked bar (GB) per ZeRO stage; ``chosen`` outlined; the capacity as a line.
    Draws into ``fig`` (default: a new headless 7 x 3.2 in Figure)."""
    fig = fig or Figure(figsize=(7, 3.2), layout="constrained")
    ax = fig.subplots()
    stages = range(len(breakdowns))
    top = stacked_bars(ax, stages, [(category.replace("_", " "),
                                     [getattr(b, category) / 1e9 for b in breakdowns], series_color(i))
                                    for i, category in enumerate(CATEGORIES)])
    ax.bar([chosen], [top[chosen]], fill=False, edgecolor="black", linewidth=2)
    ax.axhline(gpu_bytes / 1e9, color="black", linestyle="--", linewidth=1, label="GPU memory")
    ax.set(xticks=stages, xticklabels=[f"ZeRO {s}" for s in stages], ylabel="GB per GPU", title=title)
    legend_outside(ax)
    return fig
