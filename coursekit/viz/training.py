"""Chapter 1's picture: how a training run went, epoch by epoch.

:func:`plot_history` draws the mean training loss (left, log scale) and the train and
test accuracy (right, with the 95 % mark) of a :class:`coursekit.nn.History` after each
epoch; the chapter-1 panel redraws it live while the MLP trains.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .style import integer_ticks, legend_outside, readable_log_ticks

__all__ = ["plot_history"]


def plot_history(history, title: str = "", fig: Figure | None = None) -> Figure:
    """Loss (left) and train / test accuracy (right) per epoch, drawn into ``fig`` (default:
    a new headless 9 x 3.2 in Figure); returns the Figure."""
    fig = fig or Figure(figsize=(9, 3.2), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2)
    epochs = np.arange(1, history.epochs + 1)
    ax_loss.plot(epochs, history.train_loss, marker="o", ms=3)
    ax_loss.set(xlabel="epoch", ylabel="mean training loss", yscale="log")
    readable_log_ticks(ax_loss, "y")
    ax_acc.plot(epochs, history.train_accuracy, marker="o", ms=3, label="train")
    ax_acc.plot(epochs, history.test_accuracy, marker="o", ms=3, label="test")
    ax_acc.axhline(0.95, color="gray", lw=0.8, ls="--")
    ax_acc.set(xlabel="epoch", ylabel="accuracy", ylim=(0, 1.01))
    legend_outside(ax_acc)
    for ax in (ax_loss, ax_acc):
        integer_ticks(ax)
    if title:
        fig.suptitle(title)
    return fig
