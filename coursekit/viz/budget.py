"""Chapter 5's memory budget: the parameter bytes each rank holds under each strategy."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from coursekit.parallel.budget import STRATEGIES, param_bytes

from .style import legend_outside, series_color

__all__ = ["plot_budget"]


def plot_budget(sizes, p: int, budget_bytes: int, *, itemsize: int = 8, ax=None):
    """The parameter MB of every rank (bars, one group per strategy) of the MLP ``sizes`` on
    ``p`` ranks (:func:`~coursekit.parallel.budget.param_bytes`), against the budget (a
    dashed line); returns the Figure."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
    width = 0.8 / p
    top = budget_bytes
    for r in range(p):
        mb = [param_bytes(sizes, s, p, itemsize=itemsize)[r] / 1e6 for s in STRATEGIES]
        ax.bar(np.arange(len(STRATEGIES)) + (r - (p - 1) / 2) * width, mb, width,
               color=series_color(r), label=f"rank {r}")
        top = max(top, max(mb) * 1e6)
    ax.axhline(budget_bytes / 1e6, color="black", ls="--", lw=1, label="budget")
    ax.set_xticks(np.arange(len(STRATEGIES)), STRATEGIES)
    ax.set(ylabel="parameters per rank [MB]", ylim=(0, 1.15 * top / 1e6))
    ax.set_title(f"MLP {'-'.join(map(str, sizes))} on {p} ranks: who fits "
                 f"{budget_bytes / 1e6:g} MB?", fontsize=10)
    legend_outside(ax)
    return ax.figure
