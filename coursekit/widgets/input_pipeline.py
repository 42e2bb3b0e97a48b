"""Chapter 7 panel: the input pipeline, serial against prefetching, on the live ranks.

Thin by design: Run reads the controls (read and compute time per batch, reader threads,
prefetch depth) and calls the pure experiment
:func:`coursekit.parallel.input_pipeline.measure_input_pipeline` on the panel's runner
(the engines of its cluster, or ``runner=LocalRunner(n)``); the picture is
:func:`coursekit.viz.input_pipeline.plot_pipeline`. A depth below the readers is refused
by :class:`~coursekit.parallel.input_pipeline.PipelineConfig` and shown in the status line.
"""

from __future__ import annotations

import ipywidgets as widgets

from coursekit.parallel.input_pipeline import PipelineConfig, measure_input_pipeline
from coursekit.viz.input_pipeline import plot_pipeline
from coursekit.widgets.panel import Panel, png

__all__ = ["InputPipelinePanel"]


class InputPipelinePanel(Panel):
    """Controls for :class:`~coursekit.parallel.input_pipeline.PipelineConfig` (read ms,
    compute ms, readers, depth; ``batch`` and ``steps`` fixed by the arguments) on the
    rows of ``data`` = (X, y), on ``workers`` ranks (None: all); ``panel.result`` is the
    latest :class:`~coursekit.parallel.input_pipeline.PipelineResult`. ``panel_options``
    (``cluster`` or ``runner``, ``restart``, ``prepare``) go to :class:`Panel`."""

    def __init__(self, data, *, read_ms: int = 40, compute_ms: int = 30, readers: int = 2,
                 depth: int = 4, batch: int = 32, steps: int = 10, workers: int | None = None,
                 **panel_options):
        PipelineConfig(read_ms / 1e3, compute_ms / 1e3, readers, depth, batch, steps)  # checked now
        self.data, self.batch, self.steps, self.workers = data, batch, steps, workers
        style = {"description_width": "130px"}
        common = dict(style=style, continuous_update=False)
        self.read_ms = widgets.IntSlider(read_ms, min=0, max=200, step=5,
                                         description="read [ms/batch]", **common)
        self.compute_ms = widgets.IntSlider(compute_ms, min=0, max=200, step=5,
                                            description="compute [ms/step]", **common)
        self.readers = widgets.IntSlider(readers, min=1, max=8, description="reader threads",
                                         **common)
        self.depth = widgets.IntSlider(depth, min=1, max=16, description="prefetch depth",
                                       **common)
        super().__init__([self.read_ms, self.compute_ms, self.readers, self.depth], columns=2,
                         hint="Pick read and compute times, readers and depth, then press Run.",
                         **panel_options)

    def config(self) -> PipelineConfig:
        """The :class:`~coursekit.parallel.input_pipeline.PipelineConfig` the controls describe."""
        return PipelineConfig(read_s=self.read_ms.value / 1e3, compute_s=self.compute_ms.value / 1e3,
                              readers=self.readers.value, depth=self.depth.value,
                              batch=self.batch, steps=self.steps)

    def compute(self):
        """Measure both loops with the current settings."""
        return measure_input_pipeline(self.runner(), self.config(), self.data,
                                      workers=self.workers)

    def show(self, r) -> None:
        self.say(f"step {1e3 * r.serial_step.mean():.0f} ms without prefetch "
                 f"(model r + c = {1e3 * r.serial_model.mean():.0f} ms), "
                 f"{1e3 * r.overlapped_step.mean():.0f} ms with it "
                 f"(model max(r / w, c) = {1e3 * r.overlapped_model.mean():.0f} ms)")
        self.plot.value = png(plot_pipeline(r))
