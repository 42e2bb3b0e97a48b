"""Chapter 2's picture: a collective's measured time against the alpha-beta model.

:func:`plot_timing` draws a :class:`coursekit.collectives.timing.CollectiveTiming`: for
one collective and algorithm on p ranks, against the message size n, the time t (left,
log-log) and the bus bandwidth busbw = (n / t) x the collective's bus factor (right;
nccl-tests' definition, e.g. 2(p - 1)/p for allreduce), measured beside the cost model's
t(n) = a(p) alpha + b(p) n beta (:mod:`coursekit.costmodel`) for the fitted link.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .style import color, legend_outside

__all__ = ["plot_timing"]


def plot_timing(result, fig: Figure | None = None) -> Figure:
    """Time (left) and busbw (right) against message size, measured vs the alpha-beta model,
    drawn into ``fig`` (default: a new headless 9 x 3.2 in Figure); returns the Figure."""
    fig = fig or Figure(figsize=(9, 3.2), layout="constrained")
    ax_t, ax_bw = fig.subplots(1, 2)
    n = result.nbytes
    ax_t.loglog(n, result.measured * 1e3, "o", color=color("measured"), label="measured")
    ax_t.loglog(n, np.maximum(result.predicted, 1e-9) * 1e3, "-", color=color("predicted"),
                label="predicted")
    ax_t.set(xlabel="message size n [bytes]", ylabel="time [ms]")
    ax_bw.semilogx(n, result.busbw_measured / 1e9, "o-", color=color("measured"), label="measured")
    ax_bw.semilogx(n, result.busbw_predicted / 1e9, "-", color=color("predicted"),
                   label="predicted")
    ax_bw.set(xlabel="message size n [bytes]", ylabel="busbw [GB/s]")
    legend_outside(ax_t)
    fig.suptitle(f"{result.collective} ({result.algorithm}) on {result.p} ranks")
    return fig
