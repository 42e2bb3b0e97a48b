"""Chapter 1's picture: loss and both accuracies per epoch."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from coursekit.nn.experiment import train_digits  # noqa: E402
from coursekit.viz import figure_problems  # noqa: E402
from coursekit.viz.training import plot_history  # noqa: E402


def test_plot_history_draws_loss_and_both_accuracies():
    h = train_digits(epochs=2).history
    fig = plot_history(h, "title")
    loss_ax, acc_ax = fig.axes
    np.testing.assert_allclose(loss_ax.lines[0].get_ydata(), h.train_loss)
    np.testing.assert_allclose(acc_ax.lines[1].get_ydata(), h.test_accuracy)
    assert figure_problems(fig, cropped_to_content=False) == []
