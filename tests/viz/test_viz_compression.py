"""Chapter 6's picture on hand-made runs: one colour per run, the cost model dashed."""

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from coursekit.viz import figure_problems  # noqa: E402
from coursekit.viz.compression import plot_runs  # noqa: E402

ALPHA, BETA = 50e-6, 1 / 1.5e9


def run(label, p, scale):
    """A run's curves over three epochs; the model's exchange time is ``scale`` x the bytes."""
    wire = np.array([1e5, 2e5, 3e5]) * scale
    return SimpleNamespace(
        config=SimpleNamespace(label=label), p=p, wire_bytes=wire,
        test_accuracy=np.array([0.6, 0.8, 0.9]), seconds=np.array([1.0, 2.0, 3.0]),
        exchange_seconds=np.array([0.2, 0.4, 0.6]),
        predicted_exchange_seconds=lambda alpha, beta: alpha + beta * wire)


def test_each_run_has_its_colour_and_the_model_adds_predicted_exchange_to_measured_compute():
    runs = [run("topk ratio=0.01 + EF", 4, 1.0), run("sign + EF", 2, 0.1)]
    fig = plot_runs(runs, ALPHA, BETA)
    assert figure_problems(fig, cropped_to_content=False) == []
    ax_b, ax_t = fig.axes
    assert [line.get_label() for line in ax_b.lines] == ["topk ratio=0.01 + EF, p=4", "sign + EF, p=2"]
    assert ax_b.lines[0].get_color() != ax_b.lines[1].get_color()
    measured, model = ax_t.lines[0], ax_t.lines[1]
    np.testing.assert_allclose(measured.get_xdata(), runs[0].seconds)
    assert model.get_linestyle() == "--" and model.get_color() == measured.get_color()
    compute = runs[0].seconds - runs[0].exchange_seconds
    np.testing.assert_allclose(model.get_xdata(), compute + ALPHA + BETA * runs[0].wire_bytes)
    assert [t.get_text() for t in ax_t.get_legend().get_texts()] == ["measured", "cost model"]

