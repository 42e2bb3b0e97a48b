"""Chapter 7 panel: ResNet-50 data parallelism at 8 .. 4096 simulated GPUs.

Thin by design: every change of a control calls the pure experiment
:func:`coursekit.sim.at_scale.simulate_at_scale` (the scaling curve and the step at the
chosen GPU count, on the case-study workload and network of :mod:`coursekit.sim.resnet50`); the panel
(:class:`coursekit.widgets.panel.Panel`) draws the result as a PNG
(:func:`coursekit.viz.at_scale.plot_at_scale`), so it prints nothing
and works headless (tests set ``panel.gpus.value = 2048`` and read ``panel.result``).

Controls: GPUs (powers of two), allreduce (flat ring / hierarchical), the tensor-fusion
threshold ``fusion_bytes`` (the simulator's: 0 = one allreduce per tensor), FP16 gradients, images per GPU, and the straggler
jitter sigma: every GPU is slowed by a factor ``exp(|N(0, sigma)|)`` (seeded), and a
synchronous step waits for the slowest of them, so the same sigma costs more at more GPUs.
"""

from __future__ import annotations

import ipywidgets as widgets

from coursekit.sim.at_scale import GPU_COUNTS, AtScaleConfig, AtScaleResult, simulate_at_scale
from coursekit.viz.at_scale import plot_at_scale
from coursekit.widgets.panel import Panel, png

__all__ = ["ALLREDUCE", "AtScalePanel"]

BATCHES = (8, 16, 32, 64, 128, 256)
# the fusion slider: its label -> the simulator's fusion_bytes (0: one allreduce per tensor)
FUSION = {"per tensor": 0, **{f"{mib} MiB": mib << 20 for mib in (1, 2, 4, 8, 16, 32, 64, 128, 256)}}
ALLREDUCE = (("flat ring", "ring"), ("hierarchical", "hierarchical"))


class AtScalePanel(Panel):
    """Controls for :func:`~coursekit.sim.at_scale.simulate_at_scale` (the defaults and the
    checks are :class:`~coursekit.sim.at_scale.AtScaleConfig`'s); ``panel.result`` is the latest
    :class:`AtScaleResult` (None after an impossible setting), ``panel.status`` says
    efficiency, images/s and minutes for 90 epochs."""

    def __init__(self, gpus: int = 1024, algorithm: str = "hierarchical",
                 fusion_bytes: int = 64 << 20,
                 fp16: bool = True, batch: int = 64, jitter: float = 0.0,
                 network: dict | None = None):
        style = {"description_width": "130px"}
        common = dict(style=style, continuous_update=False)
        self.network = network
        self.gpus = widgets.SelectionSlider(options=GPU_COUNTS, value=gpus,
                                            description="GPUs (log scale)", **common)
        self.algorithm = widgets.ToggleButtons(options=ALLREDUCE, value=algorithm,
                                               description="allreduce", style=style)
        self.fusion = widgets.SelectionSlider(options=list(FUSION.items()), value=fusion_bytes,
                                              description="fusion buffer", **common)
        self.fp16 = widgets.Checkbox(value=fp16, description="FP16 gradients", style=style)
        self.batch = widgets.SelectionSlider(options=BATCHES, value=batch,
                                             description="images per GPU", **common)
        self.jitter = widgets.FloatSlider(value=jitter, min=0.0, max=0.3, step=0.01,
                                          description="straggler sigma", **common)
        super().__init__([self.gpus, self.algorithm, self.fusion, self.fp16, self.batch,
                          self.jitter], columns=2, auto=True)
        self.run()

    def config(self) -> AtScaleConfig:
        """The :class:`~coursekit.sim.at_scale.AtScaleConfig` the controls describe."""
        return AtScaleConfig(gpus=self.gpus.value, algorithm=self.algorithm.value,
                             fusion_bytes=self.fusion.value, fp16=self.fp16.value,
                             batch=self.batch.value, jitter=self.jitter.value,
                             network=self.network)

    def compute(self):
        """Simulate the current settings."""
        return simulate_at_scale(self.config())

    def show(self, r: AtScaleResult) -> None:
        straggle = f", slowest GPU x{r.slowest:.2f}" if r.slowest > 1 else ""
        self.say(f"{r.gpus} GPUs: efficiency {r.efficiency:.1%}, {r.images_per_s:,.0f} images/s, "
                 f"90 epochs in {r.minutes_90_epochs:.1f} min (step {1e3 * r.step.step_s:.0f} ms, "
                 f"exposed communication {1e3 * r.step.exposed_comm_s:.1f} ms{straggle})")
        label = dict((v, k) for k, v in ALLREDUCE)[self.algorithm.value]
        fusion = f"fusion {self.fusion.label}" if self.fusion.value else "no fusion"
        title = (f"ResNet-50, {self.batch.value} images per GPU, {label}, {fusion}, "
                 f"{'FP16' if self.fp16.value else 'FP32'} gradients")
        self.plot.value = png(plot_at_scale(r, title))
