"""Chapter 6's distillation runs: the teacher, the student alone and the distilled student."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .style import legend_outside, series_color

__all__ = ["plot_distillation"]

BARS = (("teacher", "teacher_accuracy"), ("student alone", "alone_accuracy"),
        ("student distilled", "distilled_accuracy"))


def plot_distillation(results, ax=None):
    """Test accuracy of each :class:`~coursekit.nn.distill.DistillResult` in ``results``:
    one group of three bars per run (teacher, student alone, distilled student), labelled
    with the run's student, T and alpha; returns the Figure."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
    x = np.arange(len(results))
    width = 0.8 / len(BARS)
    for i, (label, field) in enumerate(BARS):
        ax.bar(x + (i - 1) * width, [100 * getattr(r, field) for r in results], width,
               color=series_color(i), label=label)
    lowest = min(100 * getattr(r, field) for r in results for _, field in BARS)
    ax.set(ylabel="test accuracy [%]", ylim=(max(0.0, lowest - 5), 100))
    ax.set_xticks(x, [f"{'-'.join(map(str, r.config.student))}\nT={r.config.T:g}, "
                      f"α={r.config.alpha:g}" for r in results])
    ax.set_title("distillation runs (one group per run)", fontsize=10)
    legend_outside(ax)
    return ax.figure
