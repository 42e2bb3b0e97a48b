"""Chapter 7's pictures: ResNet-50 data parallelism at thousands of simulated GPUs.

:func:`plot_at_scale` draws one setting of the case study (the chapter-7 panel's
``AtScaleResult``): the scaling efficiency = throughput / (GPUs x one GPU without
communication) against the number of GPUs, and the simulated step at the chosen count;
:func:`draw_step` draws such a step (a :class:`coursekit.sim.step.StepResult`) on one axes.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .style import color

__all__ = ["draw_step", "plot_at_scale"]


def plot_at_scale(r, title: str = "", fig: Figure | None = None) -> Figure:
    """Left: scaling efficiency against GPUs (the chosen count ``r.gpus`` marked). Right: the
    step at the chosen count, compute on one row and the allreduces (one bar per bucket)
    below. Draws into ``fig`` (default: a new headless 10 x 3.3 in Figure)."""
    fig = fig or Figure(figsize=(10, 3.3), layout="constrained")
    ax_e, ax_t = fig.subplots(1, 2, width_ratios=[1, 1.3])
    c = r.curve
    ax_e.semilogx(c["gpus"], 100 * c["efficiency"], "o-", color=color("predicted"), base=2)
    ax_e.plot([r.gpus], [100 * r.efficiency], "o", ms=11, mfc="none", color=color("comm"))
    ax_e.set_xticks(c["gpus"], [f"{g:g}" for g in c["gpus"]], fontsize=7)
    ax_e.minorticks_off()
    ax_e.set(xlabel="GPUs", ylabel="scaling efficiency [%]", ylim=(0, 105),
             title="efficiency = throughput / (GPUs x one GPU)")
    ax_e.grid(alpha=0.3)
    draw_step(ax_t, r.step)
    ax_t.set_title(f"one step on {r.gpus} GPUs: {1e3 * r.step.step_s:.0f} ms, "
                   f"{r.step.bucket_bytes.size} allreduce(s)")
    if title:
        fig.suptitle(title)
    return fig


def draw_step(ax, step) -> None:
    """One simulated step on ``ax`` in ms: forward / backward / update on the compute row,
    one bar per bucket allreduce on the row below (the course's colours)."""
    for s in step.spans():
        if s.end > s.start:
            ax.barh(s.rank, 1e3 * s.duration, left=1e3 * s.start, height=0.6, color=color(s.kind),
                    edgecolor="white", linewidth=0.3)
    ax.set_yticks([0, 1], ["compute", "allreduce"])
    ax.set_ylim(1.6, -0.9)
    ax.set_xlabel("time in the step [ms]")
    handles = [Patch(color=color(k), label=k) for k in ("forward", "backward", "optimizer", "comm")]
    ax.legend(handles=handles, loc="upper center", fontsize=8, ncols=4, frameon=False)
