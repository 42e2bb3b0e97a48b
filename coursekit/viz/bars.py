"""Stacked bars: one bar per x, split into the parts that add up to its height.

Where the time of a step, of a worker, or the bytes of a GPU go (compute +
communication, compute + send + idle, parameters + gradients + optimizer states +
activations) are all drawn by :func:`stacked_bars`, so they look alike.
"""

from __future__ import annotations

import numpy as np

__all__ = ["stacked_bars"]


def stacked_bars(ax, x, parts) -> np.ndarray:
    """Draw ``parts`` = ``[(label, values, colour), ...]`` bottom first as stacked bars at
    ``x`` on ``ax`` (part k starts where parts 0..k-1 end); returns the tops, the sums
    over the parts at each x."""
    top = np.zeros(len(x))
    for label, values, colour in parts:
        values = np.asarray(values, dtype=float)
        ax.bar(x, values, bottom=top, color=colour, label=label)
        top = top + values
    return top
