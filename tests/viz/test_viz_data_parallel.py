"""Chapter 3's live picture, from the ranks' streamed data."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from coursekit.parallel.spans import Span  # noqa: E402
from coursekit.viz import color, figure_problems  # noqa: E402
from coursekit.viz.data_parallel import live_loss, plot_live  # noqa: E402


def test_a_live_update_without_spans_yet_keeps_its_labels_inside():
    # the first updates carry losses but no step spans: nothing laid the figure out then,
    # and the PNG cut the 'step' label off at its bottom edge
    data = [{"loss": [2.3, 2.1], "weight": [0.5, 0.5]}, {"loss": [2.2, 2.0], "weight": [0.5, 0.5]}]
    assert figure_problems(plot_live(data), cropped_to_content=False) == []


def test_the_live_loss_weights_each_rank_and_waits_for_the_slowest():
    data = [{"loss": [2.0, 1.0, 0.5], "weight": [0.25, 0.25, 0.25]},
            {"loss": [4.0, 3.0], "weight": [0.75, 0.75]}]  # rank 1 has published 2 steps
    np.testing.assert_allclose(live_loss(data), [0.25 * 2 + 0.75 * 4, 0.25 * 1 + 0.75 * 3])
    assert live_loss([{}, {}]).size == 0


def test_the_latest_step_shows_every_rank_with_waiting_under_the_rest():
    data = [{"loss": [2.3], "weight": [0.5], "spans": [Span(0, "compute", 0.0, 0.004),
                                                       Span(0, "comm", 0.004, 0.005)]},
            {"loss": [2.1], "weight": [0.5], "spans": [Span(1, "compute", 0.0, 0.002),
                                                       Span(1, "idle", 0.002, 0.004),
                                                       Span(1, "comm", 0.004, 0.005)]}]
    fig = plot_live(data)
    assert figure_problems(fig, cropped_to_content=False) == []
    ax_loss, ax_tl = fig.axes
    np.testing.assert_allclose(ax_loss.lines[0].get_ydata(), [0.5 * 2.3 + 0.5 * 2.1])
    assert ax_tl.get_title() == "latest step"
    assert len(ax_tl.collections) == 5  # one bar per span, idle drawn first
    assert np.allclose(ax_tl.collections[0].get_facecolor()[0], to_rgba(color("idle")))
    assert [t.get_text() for t in ax_tl.get_yticklabels()] == ["rank 0", "rank 1"]


def test_the_runs_loss_axis_prints_plain_decimals():
    """The loss is dimensionless: its log axis reads 0.5, not the SI prefix "500m"."""
    from coursekit.cluster.runner import LocalRunner
    from coursekit.data import load_digits
    from coursekit.parallel.data_parallel import DPConfig, train
    from coursekit.viz.data_parallel import plot_run

    d = load_digits()
    r = train(LocalRunner(2), DPConfig(sizes=(64, 16, 10), epochs=5, lr=0.5),
              (d.X_train[:640], d.y_train[:640]))
    assert r.loss.min() < 1 < r.loss.max(), r.loss  # the axis spans ticks below 1
    fig = plot_run(r)
    fig.canvas.draw()
    ax = fig.axes[0]
    ticks = [t for t in ax.yaxis.get_major_ticks() if ax.get_ylim()[0] <= t.get_loc() <= ax.get_ylim()[1]]
    labels = [t.label1.get_text() for t in ticks]
    assert labels and all(float(s) == float(t.get_loc()) for s, t in zip(labels, ticks)), labels
    assert any(float(s) < 1 for s in labels), labels
