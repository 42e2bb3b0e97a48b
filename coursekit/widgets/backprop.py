"""Chapter 1 panel: train an MLP on the digits with the settings the sliders pick.

The panel is thin: the Run button reads the controls and calls the pure experiment
function (:func:`coursekit.nn.experiment.train_digits` by default) with a
:class:`LivePlot` as its per-epoch callback, so the curves grow while it trains.
Layout, Run / Stop and errors come from :class:`coursekit.widgets.panel.Panel`; nothing
is printed and everything works headless (tests set ``panel.hidden.value = 16`` and call
``panel.run()``, or click Run and ``panel.wait()``).
"""

from __future__ import annotations

import time

import ipywidgets as widgets

from coursekit.nn.activations import HIDDEN_ACTIVATIONS
from coursekit.nn.experiment import train_digits
from coursekit.viz.training import plot_history
from coursekit.widgets.panel import LiveRepr, Panel, png

__all__ = ["BackpropPanel", "LivePlot"]

DIGITS_TRAIN_ROWS = 1797 - 450  # load_digits' training rows at its default split (450 test images)
# batch 1 is SGD, a batch of every training row full-batch gradient descent (chapter 1 §3.1)
BATCH_SIZES = (("1", 1), ("8", 8), ("16", 16), ("32", 32), ("64", 64), ("128", 128),
               ("256", 256), (f"all ({DIGITS_TRAIN_ROWS})", DIGITS_TRAIN_ROWS))


class LivePlot(LiveRepr, widgets.Image):
    """An image of :func:`coursekit.viz.training.plot_history` that redraws when called:
    ``train(..., callback=live)``.

    Drawing a figure takes a good fraction of a second, so calls closer than
    ``min_interval`` seconds to the last drawing are skipped; ``force=True`` always draws
    (use it once with the final history).
    """

    def __init__(self, title: str = "", min_interval: float = 0.5):
        super().__init__(format="png")
        self.title, self.min_interval, self._drawn_at = title, min_interval, -float("inf")

    def __call__(self, history, force: bool = False) -> None:
        if force or time.monotonic() - self._drawn_at >= self.min_interval:
            self.value = png(plot_history(history, self.title))
            self._drawn_at = time.monotonic()


class BackpropPanel(Panel):
    """Sliders for hidden size, learning rate, batch size, activation, epochs; a Run button.

    ``experiment(hidden=, lr=, batch_size=, activation=, epochs=, seed=, callback=)`` must
    call ``callback(history)`` after each epoch and return an object with ``.history`` and
    ``.test_accuracy`` (a :class:`DigitsResult`); the latest one is kept in ``panel.result``.
    Stop ends the training at the end of the current epoch.
    """

    def __init__(self, experiment=train_digits, seed: int = 0):
        self.experiment, self.seed = experiment, seed
        style = {"description_width": "110px"}
        self.hidden = widgets.IntSlider(64, min=4, max=256, step=4, description="hidden units", style=style)
        self.lr = widgets.FloatLogSlider(
            0.1, base=10, min=-3, max=0.5, step=0.1, description="learning rate", style=style
        )
        self.batch_size = widgets.SelectionSlider(options=BATCH_SIZES, value=32, description="batch size", style=style)
        self.activation = widgets.Dropdown(
            options=HIDDEN_ACTIVATIONS, value="relu", description="activation", style=style
        )
        self.epochs = widgets.IntSlider(20, min=1, max=60, description="epochs", style=style)
        super().__init__([self.hidden, self.lr, self.batch_size, self.activation, self.epochs],
                         plot=LivePlot())

    def settings(self) -> dict:
        """The experiment's keyword arguments as the controls show them now."""
        return {
            "hidden": self.hidden.value,
            "lr": self.lr.value,
            "batch_size": self.batch_size.value,
            "activation": self.activation.value,
            "epochs": self.epochs.value,
            "seed": self.seed,
        }

    def compute(self):
        """Train with the current settings; the plot grows after every epoch."""
        settings = self.settings()
        self.plot.title = "{activation}, {hidden} hidden, lr {lr:.3g}, batch {batch_size}".format(**settings)
        self.plot._drawn_at = -float("inf")  # a new run draws its first epoch at once

        def epoch_done(history):
            self.progress_to(history.epochs, settings["epochs"])
            self.plot(history)

        return self.experiment(**settings, callback=epoch_done)

    def show(self, result) -> None:
        self.plot(result.history, force=True)
        h = result.history
        if h.diverged_at is not None:
            self.say(f"diverged in epoch {h.diverged_at}: the loss overflowed to NaN (test accuracy "
                     f"{result.test_accuracy:.1%}, a guess); lower the learning rate")
        else:
            self.say(f"test accuracy {result.test_accuracy:.1%} after {h.epochs} epochs ({h.seconds:.2f} s)")
