"""Chapter 6 panel: train with a compressor on the live cluster, plot accuracy vs bytes and time.

Thin: Run reads the controls (compressor, its ratio / bits / levels / rank / threshold,
error feedback, workers, epochs), calls the pure experiment
:func:`coursekit.parallel.compression.experiment.train` and draws every run so far, so
runs can be compared: test accuracy against the bytes a worker sent (left) and against
time (right, measured; dashed: the cost model, i.e. the measured compute plus the
predicted exchange time for the fitted ``alpha`` and ``beta``). The status line gives the
cost model's prediction of the communication time saved against an uncompressed
float32 allreduce. Layout, Run / Stop, errors and a lost cluster:
:class:`coursekit.widgets.panel.Panel`; nothing is printed, tests drive it headless
(``panel.compressor.value = "topk"``; ``panel.run()``).
"""

from __future__ import annotations

import ipywidgets as widgets

from coursekit.costmodel import check_link
from coursekit.parallel.compression import COMPRESSORS, make_compressor
from coursekit.parallel.compression.experiment import CompressionConfig, train
from coursekit.viz.compression import plot_runs
from coursekit.nn.mlp import check_device
from coursekit.widgets.panel import Panel, device_summary, run_target, png, size_limit

__all__ = ["CompressionPanel", "VALUES"]

VALUES = {
    "ratio": (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0),
    "bits": (2, 3, 4, 6, 8, 12, 16),
    "levels": (1, 2, 4, 8, 16, 64, 256),
    "rank": (1, 2, 4, 8),
    "threshold": (0.003, 0.01, 0.03, 0.1, 0.3),
}
"""The choices the value slider offers for each kind of parameter."""


def exchange_comparison(result, alpha: float, beta: float) -> str:
    """One sentence: the cost model's exchange time of the whole run, compressed vs not."""
    compressed = result.predicted_exchange_seconds(alpha, beta)[-1]
    plain = result.predicted_uncompressed_seconds(alpha, beta)[-1]
    steps = result.steps_per_epoch * len(result.test_accuracy)
    verdict = "saves" if compressed <= plain else "costs"
    return (f"cost model over the run's {steps} steps: {compressed * 1e3:.3g} ms exchanging with "
            f"{result.collective} vs {plain * 1e3:.3g} ms for a float32 allreduce "
            f"({verdict} {abs(plain - compressed) * 1e3:.3g} ms)")


class CompressionPanel(Panel):
    """Controls and plot; ``panel.results`` holds every run since the last Clear.

    ``link``: the fitted link the cost model uses, anything with ``.alpha`` (s) and ``.beta``
    (s/B) (``measure.link(runner)``, or a :class:`~coursekit.costmodel.LinkFit`). ``panel_options``
    (``cluster``: a started cluster with a Comm on its engines, or ``runner``: e.g.
    ``LocalRunner(4)``; ``restart``, ``prepare``) go to :class:`Panel`. ``device`` ("cpu",
    "cuda", "auto") is where the workers compute; the status line ends with where each did.
    """

    def __init__(self, *, link, max_workers: int | None = None, epochs: int = 10,
                 seed: int = 0, experiment=train, device: str = "cpu", **panel_options):
        max_workers = size_limit("max_workers", max_workers, run_target(panel_options))
        self.device = check_device(device)
        self.alpha, self.beta = check_link(link)
        self.seed = seed
        self.experiment = experiment
        style = {"description_width": "110px"}
        self.compressor = widgets.Dropdown(options=list(COMPRESSORS), value="topk",
                                           description="compressor", style=style)
        self.value = widgets.SelectionSlider(options=[("-", 0)], description="value",
                                             style=style)
        self.error_feedback = widgets.Checkbox(True, description="error feedback", style=style)
        self.workers = widgets.IntSlider(max_workers, min=1, max=max_workers,
                                         description="workers", style=style)
        self.epochs = widgets.IntSlider(epochs, min=1, max=30, description="epochs", style=style)
        self.compressor.observe(lambda change: self._set_values(change["new"]), names="value")
        self._set_values(self.compressor.value)
        super().__init__([self.compressor, self.value, self.error_feedback, self.workers,
                          self.epochs], keep_runs=True,
                         hint="Pick a compressor and press Run.", **panel_options)

    def _set_values(self, name: str) -> None:
        # error feedback by default for the biased compressors only: an unbiased one needs
        # none, and with its variance omega > 1 error feedback diverges (divergence_advice)
        self.error_feedback.value = not make_compressor(name, sizes=(8, 8)).unbiased
        param, default = COMPRESSORS[name].param, COMPRESSORS[name].default
        if param is None:
            self.value.options, self.value.disabled = [("-", 0)], True
            self.value.description = "value"
            return
        self.value.options = [(f"{v:g}", v) for v in VALUES[param]]
        self.value.value, self.value.disabled = default, False
        self.value.description = param

    def config(self) -> CompressionConfig:
        """The run the controls describe."""
        name = self.compressor.value
        value = self.value.value if COMPRESSORS[name].param else None
        return CompressionConfig(name, value, self.error_feedback.value,
                     epochs=self.epochs.value, seed=self.seed, device=self.device)

    def compute(self):
        """Train with the current settings, following the workers live."""
        return self.experiment(self.runner(), self.config(), workers=self.workers.value,
                               on_update=self.on_data)

    def draw_live(self, data) -> None:
        evals = next((d["evals"] for d in data if d.get("evals")), None)  # rank 0's
        if evals:
            self.say(f"running: epoch {len(evals)}, test accuracy {evals[-1][1]:.1%}")

    def show(self, result) -> None:
        self.say(f"{result.config.label}: {result.final_accuracy:.1%} test accuracy, "
                 f"{result.wire_bytes[-1] / 1e6:.3g} MB sent per worker; "
                 + exchange_comparison(result, self.alpha, self.beta)
                 + f"; {device_summary(result.devices)}")
        self.plot.value = png(plot_runs(self.results, self.alpha, self.beta))
