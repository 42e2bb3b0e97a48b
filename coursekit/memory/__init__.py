"""Chapter 8: where a GPU's memory goes in training, and how long a step takes.

* :mod:`~coursekit.memory.shapes` - :class:`ModelShape`: Ψ and the activations one sample
  keeps; presets for the MLP, GPT-style transformers, ResNet-50.
* :mod:`~coursekit.memory.accounting` - :func:`memory_per_gpu`: parameters, gradients,
  optimizer states, activations per GPU, for a precision, an optimizer, ZeRO stages 0-3,
  tensor and pipeline parallelism and recomputation (Rajbhandari et al. 2020,
  Korthikanti et al. 2022).
* :mod:`~coursekit.memory.measure` - :func:`measure_mlp`: the same categories measured on
  the real MLP, byte for byte.
* :mod:`~coursekit.memory.step_time` - :func:`step_time`: FLOPs at a throughput plus the
  data-parallel exchange from :mod:`coursekit.costmodel`.
"""

from coursekit.memory.accounting import (
    OPTIMIZERS,
    PRECISIONS,
    MemoryBreakdown,
    TrainingSetup,
    bytes_per_param,
    memory_per_gpu,
)
from coursekit.memory.measure import MlpMeasurement, fused_step_transient_bytes, measure_mlp
from coursekit.memory.shapes import (
    PRESETS,
    RESNET50,
    Kept,
    ModelShape,
    mlp_shape,
    transformer_shape,
)
from coursekit.memory.step_time import StepTime, step_time

__all__ = [
    "OPTIMIZERS", "PRECISIONS", "PRESETS", "RESNET50", "Kept", "MemoryBreakdown",
    "MlpMeasurement", "ModelShape", "StepTime", "TrainingSetup", "bytes_per_param",
    "fused_step_transient_bytes", "measure_mlp", "memory_per_gpu", "mlp_shape", "step_time",
    "transformer_shape",
]
