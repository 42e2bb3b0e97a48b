"""AlexNet's two-GPU split (Krizhevsky, Sutskever and Hinton, 2012) as a tensor split.

AlexNet did not fit one 3 GB GTX 580, so every layer's kernels (a fully connected layer's
neurons) were split in half, one half per GPU: a column split of each layer
(:mod:`~coursekit.parallel.tensor_parallel`). The GPUs talk only at the layers whose kernels
take input from **both** halves of the layer below: conv3, fc6, fc7 and fc8 (conv2, conv4
and conv5 see only the kernel maps of their own GPU), and at the softmax, which needs all
1000 outputs. Layer shapes from the paper (Figure 2), kernels x (kernel height x width x
input maps seen):

=====  =========  =================  ==========================  ================
layer  kernels    each kernel        input maps seen per kernel  input from
=====  =========  =================  ==========================  ================
conv1  96         11 x 11 x 3        the image                   (the data)
conv2  256        5 x 5 x 48         its own GPU's 48            own GPU
conv3  384        3 x 3 x 256        all 256 (13 x 13 each)      **both GPUs**
conv4  384        3 x 3 x 192        its own GPU's 192           own GPU
conv5  256        3 x 3 x 192        its own GPU's 192           own GPU
fc6    4096       6 x 6 x 256        all 9216 values             **both GPUs**
fc7    4096       4096               all 4096                    **both GPUs**
fc8    1000       4096               all 4096                    **both GPUs**
=====  =========  =================  ==========================  ================

With g GPUs (the paper: 2), ``itemsize`` bytes per number (float32: 4) and a batch of B
images:

* parameters per GPU: ``sum_layers (kernels / g) (weights per kernel + 1)`` numbers (every
  kernel has one bias);
* sent per GPU and step: for every layer taking input from every GPU, and for the softmax's
  1000 outputs, each GPU sends its ``1/g`` of that input (per image) to each of the
  ``g - 1`` others in the forward pass, and the gradient of the same values back in the
  backward pass: ``2 B itemsize (g - 1)/g sum_cross n_in``, with n_in = 13 x 13 x 256
  (conv3), 6 x 6 x 256 (fc6), 4096 (fc7), 4096 (fc8) and 1000 (softmax).

Data parallelism would instead keep the whole model on every GPU and allreduce its whole
gradient: ``2 (g - 1)/g x P x itemsize`` per GPU, P every layer's parameters (61 M)
(:func:`coursekit.parallel.traffic.data_parallel_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from coursekit import checks

__all__ = ["ALEXNET", "SplitLayer", "TwoGPUSplit", "alexnet_split"]


class SplitLayer(NamedTuple):
    """One layer of a split network: ``kernels`` (output maps or neurons of the whole layer),
    ``weights`` per kernel, and ``cross_input``: how many values per image its input has
    when it takes input from every GPU (0: only from its own GPU)."""

    name: str
    kernels: int
    weights: int
    cross_input: int


ALEXNET = (
    SplitLayer("conv1", 96, 11 * 11 * 3, 0),
    SplitLayer("conv2", 256, 5 * 5 * 48, 0),
    SplitLayer("conv3", 384, 3 * 3 * 256, 13 * 13 * 256),
    SplitLayer("conv4", 384, 3 * 3 * 192, 0),
    SplitLayer("conv5", 256, 3 * 3 * 192, 0),
    SplitLayer("fc6", 4096, 6 * 6 * 256, 6 * 6 * 256),
    SplitLayer("fc7", 4096, 4096, 4096),
    SplitLayer("fc8", 1000, 4096, 4096),
    SplitLayer("softmax", 0, 0, 1000),  # no parameters: it needs all 1000 outputs
)
"""AlexNet's layers (Krizhevsky et al. 2012, Figure 2), as the module docstring's table."""


@dataclass(frozen=True)
class TwoGPUSplit:
    """``params_per_gpu`` (numbers), ``param_bytes_per_gpu``, ``sent_bytes_per_gpu`` (one
    training step of ``batch`` images) and the data-parallel exchange for comparison
    (``data_parallel_bytes_per_gpu``), per GPU; ``per_layer``: {name: (params per GPU,
    values sent per GPU and image, forward)}."""

    gpus: int
    batch: int
    itemsize: int
    params_per_gpu: int
    param_bytes_per_gpu: int
    sent_bytes_per_gpu: int
    data_parallel_bytes_per_gpu: int
    per_layer: dict


def alexnet_split(layers=ALEXNET, *, gpus: int = 2, batch: int = 128,
                  itemsize: int = 4) -> TwoGPUSplit:
    """Bytes per GPU of ``layers`` with every layer's kernels split over ``gpus`` GPUs (the
    module docstring's formulas; defaults: the paper's 2 GPUs, batch 128, float32)."""
    gpus = checks.integer(gpus, "gpus", at_least=1)
    batch = checks.integer(batch, "batch", at_least=1, hint=" (images per step)")
    itemsize = checks.integer(itemsize, "itemsize", at_least=1, hint=" (bytes per number)")
    per_layer = {}
    for layer in layers:
        checks.instance(layer, "layer", SplitLayer)
        for what in ("kernels", "cross_input"):
            if getattr(layer, what) % gpus:
                raise ValueError(f"{layer.name}: {what}={getattr(layer, what)} cannot be split "
                                 f"evenly over gpus={gpus}")
        params = layer.kernels // gpus * (layer.weights + 1) if layer.kernels else 0
        per_layer[layer.name] = (params, layer.cross_input // gpus * (gpus - 1))
    params = sum(p for p, _ in per_layer.values())
    sent = 2 * batch * itemsize * sum(s for _, s in per_layer.values())
    data_parallel = 2 * (gpus - 1) * params * itemsize  # 2 (g-1)/g of the g halves
    return TwoGPUSplit(gpus, batch, itemsize, params, params * itemsize, sent, data_parallel,
                       per_layer)
