"""Chapter 8 panel: does a model's training fit on a GPU, and how long does a step take?

Controls: model (the :data:`coursekit.memory.PRESETS`), precision, optimizer, ZeRO stage,
data-parallel GPUs N, tensor-parallel t, pipeline stages p, micro-batch b, micro-batches
m, recomputation, GPU memory and throughput, link bandwidth. Every change recomputes
:func:`coursekit.memory.memory_per_gpu` and :func:`coursekit.memory.step_time` (pure
formulas, instant), so the panel has no Run or Stop button (there is nothing to start or
wait for), and draws the bytes per GPU as one stacked bar per ZeRO stage, the
chosen one outlined, with the GPU's capacity as a line
(:func:`coursekit.viz.memory.plot_memory`). The status says whether it fits and what a
step costs.
"""

from __future__ import annotations

import dataclasses

import ipywidgets as widgets

from coursekit.memory import OPTIMIZERS, PRECISIONS, PRESETS, TrainingSetup, memory_per_gpu, step_time
from coursekit.viz.memory import plot_memory
from coursekit.widgets.panel import Panel, png

__all__ = ["MemoryPanel"]

LINK_ALPHA_S = 5e-6  # a GPU cluster's per-message latency, as in chapter 7
LABEL_WIDTH = "140px"  # every control's description; each label fits it (tests/widgets)


class MemoryPanel(Panel):
    """``panel.result`` is ([MemoryBreakdown of ZeRO stage 0, 1, 2, 3], StepTime of the
    chosen stage); ``panel.status`` says whether the chosen stage fits and the step's time."""

    def __init__(self, model: str = "gpt-7b-2k", **setup):
        style = {"description_width": LABEL_WIDTH}

        def pick(options, value, label):
            return widgets.Dropdown(options=options, value=value, description=label, style=style)

        def ints(value, lo, hi, label):
            return widgets.IntSlider(value, min=lo, max=hi, description=label, style=style,
                                     continuous_update=False)

        base = TrainingSetup(**setup)
        self.model = pick(list(PRESETS), model, "model")
        self.precision = pick(list(PRECISIONS), base.precision, "precision")
        self.optimizer = pick(list(OPTIMIZERS), base.optimizer, "optimizer")
        self.stage = ints(base.stage, 0, 3, "ZeRO stage")
        self.dp = widgets.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
                                   value=base.dp, description="GPUs N (data)", style=style)
        self.tp = pick([1, 2, 4, 8], base.tp, "tensor t")
        self.pp = pick([1, 2, 4, 8, 16], base.pp, "pipeline p")
        self.micro_batch = ints(base.micro_batch, 1, 64, "micro-batch b")
        self.micro_batches = ints(base.micro_batches, 1, 64, "micro-batches m")
        self.recompute = widgets.Checkbox(base.recompute, description="recomputation",
                                          style=style)
        self.gpu_gb = pick([16, 24, 40, 80, 141], 80, "GPU memory [GB]")
        self.tflops = widgets.FloatSlider(400.0, min=10.0, max=1000.0, step=10.0,
                                          description="GPU TFLOP/s", style=style,
                                          continuous_update=False)
        self.link_gbs = widgets.FloatSlider(50.0, min=1.0, max=400.0, step=1.0,
                                            description="link GB/s", style=style,
                                            continuous_update=False)
        super().__init__([self.model, self.precision, self.optimizer, self.stage, self.dp,
                          self.tp, self.pp, self.micro_batch, self.micro_batches,
                          self.recompute, self.gpu_gb, self.tflops, self.link_gbs],
                         columns=2, auto=True)
        for button in (self.run_button, self.stop_button):  # every change already recomputes
            button.layout.display = "none"
        self.run()

    def setup(self) -> TrainingSetup:
        """The TrainingSetup the controls describe."""
        return TrainingSetup(precision=self.precision.value, optimizer=self.optimizer.value,
                             stage=self.stage.value, dp=self.dp.value, tp=self.tp.value,
                             pp=self.pp.value, micro_batch=self.micro_batch.value,
                             micro_batches=self.micro_batches.value,
                             recompute=self.recompute.value)

    def compute(self):
        model, setup = PRESETS[self.model.value], self.setup()
        every_stage = [memory_per_gpu(model, dataclasses.replace(setup, stage=s)) for s in range(4)]
        time = step_time(model, setup, flops_per_s=self.tflops.value * 1e12,
                         alpha=LINK_ALPHA_S, beta=1 / (self.link_gbs.value * 1e9))
        return every_stage, time

    def show(self, result) -> None:
        every_stage, time = result
        chosen, gpu = every_stage[self.stage.value], self.gpu_gb.value * 1e9
        verdict = "fits on" if chosen.fits(gpu) else "does NOT fit on"
        self.say(f"{chosen.total / 1e9:.1f} GB per GPU: {verdict} a {self.gpu_gb.value} GB GPU; "
                 f"step {time.total * 1e3:.0f} ms = compute {time.compute * 1e3:.0f} + bubble "
                 f"{time.bubble * 1e3:.0f} + communication {time.communication * 1e3:.0f} ms")
        self.plot.value = png(plot_memory(every_stage, self.stage.value, gpu,
                                          PRESETS[self.model.value].name))
