"""Chapter 5 panel: a memory budget per engine, and the strategies that fit it.

Thin by design: Run builds a :class:`~coursekit.parallel.budget.BudgetConfig` from the controls
(the budget in MB, the strategy) and calls the pure experiment
:func:`coursekit.parallel.budget.step_within_budget` on the panel's runner (its cluster's
engines, or ``runner=LocalRunner(n)``). A strategy that does not fit is refused before any
engine starts, and its :class:`~coursekit.parallel.budget.MemoryBudgetError` (bytes needed,
the budget, what the other strategies need) is the status line; after a run, the picture
shows every strategy's bytes per rank against the budget (:func:`coursekit.viz.budget.plot_budget`).
"""

from __future__ import annotations

import ipywidgets as widgets

from coursekit.parallel.budget import STRATEGIES, BudgetConfig, step_within_budget
from coursekit.viz.budget import plot_budget
from coursekit.widgets.panel import Panel, png

__all__ = ["BudgetPanel"]


class BudgetPanel(Panel):
    """Controls: the parameter budget of one engine in MB, the strategy; Run runs one step of
    the MLP ``sizes`` on (X, y) = ``data`` under it. ``panel_options`` (``cluster`` or
    ``runner``, ``restart``, ``prepare``) go to :class:`Panel`."""

    def __init__(self, sizes, data, *, budget_mb: float = 8.0, strategy: str = "tensor parallel",
                 **panel_options):
        BudgetConfig(sizes, strategy, round(budget_mb * 1e6))  # checked now
        self.sizes, self.data = tuple(sizes), data
        style = {"description_width": "130px"}
        self.budget_mb = widgets.FloatSlider(budget_mb, min=1.0, max=20.0, step=0.5,
                                             description="budget [MB]", style=style,
                                             continuous_update=False)
        self.strategy = widgets.Dropdown(options=STRATEGIES, value=strategy,
                                         description="strategy", style=style)
        super().__init__([self.budget_mb, self.strategy], columns=2,
                         hint="Pick a budget and a strategy, then press Run.", **panel_options)

    def config(self) -> BudgetConfig:
        return BudgetConfig(self.sizes, self.strategy.value, round(self.budget_mb.value * 1e6))

    def compute(self):
        """One step under the chosen strategy, or the refusal (before any engine starts)."""
        return step_within_budget(self.runner(), self.config(), *self.data)

    def show(self, r) -> None:
        held = ", ".join(f"{b / 1e6:.2f}" for b in r.held_bytes.tolist())
        self.say(f"{r.config.strategy}: MB of parameters per engine {held} <= "
                 f"{r.config.budget_bytes / 1e6:g} MB; one step ran, loss {r.loss:.3f}")
        self.plot.value = png(plot_budget(self.sizes, r.p, r.config.budget_bytes,
                                          itemsize=r.config.itemsize))
