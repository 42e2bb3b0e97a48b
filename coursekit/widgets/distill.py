"""Chapter 6 panel: knowledge distillation with the temperature, the soft-target weight and the
student's width the controls pick.

Thin by design: Run builds a :class:`~coursekit.nn.distill.DistillConfig` from the controls
and calls the pure experiment :func:`coursekit.nn.distill.distill` in the kernel (one process:
the teacher, then the same student alone and distilled); every run is kept and drawn side by
side (:func:`coursekit.viz.distill.plot_distillation`). alpha starts at 0.05: alpha = 0 is
the student alone, which every run already trains beside the distilled one.
"""

from __future__ import annotations

import dataclasses

import ipywidgets as widgets

from coursekit.nn.distill import DistillConfig, distill
from coursekit.widgets.panel import Panel, png
from coursekit.viz.distill import plot_distillation

__all__ = ["DistillationPanel"]


class DistillationPanel(Panel):
    """Controls: temperature T, soft-target weight alpha, the student's hidden width, epochs;
    ``base`` holds the rest (the teacher, lr, batch size, seed); ``data`` is a
    :class:`coursekit.data.Dataset` (e.g. ``load_digits()``). ``panel.results`` keeps every
    finished run."""

    def __init__(self, data, base: DistillConfig | None = None):
        self.data = data
        self.base = base or DistillConfig()
        style = {"description_width": "130px"}
        common = dict(style=style, continuous_update=False)
        self.T = widgets.FloatSlider(self.base.T, min=1.0, max=10.0, step=0.5,
                                     description="temperature T", **common)
        self.alpha = widgets.FloatSlider(self.base.alpha, min=0.05, max=1.0, step=0.05,
                                         description="soft weight α", **common)
        self.width = widgets.IntSlider(self.base.student[1], min=2, max=64,
                                       description="student width", **common)
        self.epochs = widgets.IntSlider(self.base.epochs, min=1, max=40,
                                        description="epochs", **common)
        super().__init__([self.T, self.alpha, self.width, self.epochs], columns=2, keep_runs=True,
                         hint="Pick T, α and the student's width, then press Run.")

    def config(self) -> DistillConfig:
        """The DistillConfig the controls describe (one hidden layer of the chosen width)."""
        n_in, n_out = self.base.student[0], self.base.student[-1]
        return dataclasses.replace(self.base, T=self.T.value, alpha=self.alpha.value,
                                   student=(n_in, self.width.value, n_out),
                                   epochs=self.epochs.value)

    def compute(self):
        """Train the teacher, then the student alone and distilled."""
        return distill(self.config(), self.data)

    def show(self, r) -> None:
        gain = 100 * (r.distilled_accuracy - r.alone_accuracy)
        self.say(f"student {'-'.join(map(str, r.config.student))}, T={r.config.T:g}, "
                 f"α={r.config.alpha:g}: distilled {r.distilled_accuracy:.1%}, alone "
                 f"{r.alone_accuracy:.1%} ({gain:+.1f} points), teacher {r.teacher_accuracy:.1%}; "
                 f"{r.teacher_flops / r.student_flops:.0f}x fewer FLOPs per row")
        self.plot.value = png(plot_distillation(self.results))
