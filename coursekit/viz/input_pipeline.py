"""Chapter 7's input pipeline: step times without and with prefetching, beside their models."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .style import integer_ticks, legend_outside, series_color

__all__ = ["plot_pipeline"]


def plot_pipeline(result, ax=None):
    """Each step's time (mean over the ranks) of the serial and the prefetching loop of a
    :class:`~coursekit.parallel.input_pipeline.PipelineResult`, with the models r + c and
    max(r / w, c) as dashed lines; returns the Figure."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
    cfg = result.config
    steps = np.arange(1, cfg.steps + 1)
    rows = [("no prefetch", result.serial_steps, result.serial_model, "model r + c"),
            ("prefetch", result.overlapped_steps, result.overlapped_model, "model max(r / w, c)")]
    top = 0.0
    for i, (label, times, model, model_label) in enumerate(rows):
        ax.plot(steps, 1e3 * times.mean(axis=0), "o-", color=series_color(i), label=label)
        ax.axhline(1e3 * model.mean(), color=series_color(i), ls="--", lw=1, label=model_label)
        top = max(top, 1e3 * times.mean(axis=0).max(), 1e3 * model.mean())
    plural = lambda n, word: f"{n} {word}{'s' if n != 1 else ''}"  # noqa: E731
    ax.set(xlabel="step", ylabel="step time [ms]", ylim=(0, 1.15 * top))
    ax.set_title(f"{plural(cfg.readers, 'reader')}, depth {cfg.depth}\nread {1e3 * cfg.read_s:g} ms, "
                 f"compute {1e3 * cfg.compute_s:g} ms, mean of {plural(result.ranks, 'rank')}",
                 fontsize=10)
    integer_ticks(ax)
    legend_outside(ax)
    return ax.figure
