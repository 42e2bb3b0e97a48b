"""The chapter-5 budget panel: a step under the chosen strategy, or the refusal, headlessly."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from coursekit.cluster.runner import LocalRunner  # noqa: E402
from coursekit.parallel.budget import param_bytes  # noqa: E402
from coursekit.viz.budget import plot_budget  # noqa: E402
from coursekit.viz.check import figure_problems  # noqa: E402
from coursekit.widgets.budget import BudgetPanel  # noqa: E402

SIZES = (64, 256, 512, 256, 10)  # 282,122 float64 parameters: 2.26 MB whole


def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((16, 64)), rng.integers(0, 10, 16)


def test_a_strategy_that_fits_runs_and_one_that_does_not_is_refused():
    panel = BudgetPanel(SIZES, data(), budget_mb=2.0, strategy="tensor parallel",
                        runner=LocalRunner(2))
    panel.run()
    held = panel.result.held_bytes
    assert held.tolist() == param_bytes(SIZES, "tensor parallel", 2).tolist()
    assert held.max() <= 2_000_000
    assert f"{held[0] / 1e6:.2f}" in panel.status.value and "one step ran" in panel.status.value
    assert panel.plot.value[:4] == b"\x89PNG"
    panel.strategy.value = "data parallel"  # the whole model on every engine
    assert panel.run() is None
    whole, split = (param_bytes(SIZES, s, 2).max() / 1e6 for s in ("data parallel", "tensor parallel"))
    assert whole > 2 > split
    assert panel.status.value.startswith(f"error: data parallel needs {whole:.2f} MB")
    assert f"tensor parallel: {split:.2f} MB" in panel.status.value  # what the split would need


def test_the_picture_keeps_the_figure_rules():
    assert figure_problems(plot_budget(SIZES, 2, 2_000_000)) == []
