"""What a model costs in memory whatever the training set-up: Ψ and its activations.

A :class:`ModelShape` holds the number of parameters Ψ, the training FLOPs of one sample,
and what ONE sample (a row for the MLP, a sequence for a transformer, an image for a CNN)
keeps for the backward pass. What is kept is counted as :class:`Kept`: ``values`` stored
at the activation precision (2 bytes each in 16-bit training, 4 in fp32) plus one-byte
dropout masks, so one count serves every precision::

    bytes = values * itemsize + mask_bytes

Three counts per sample: ``kept`` (what tensor parallelism leaves whole on every rank),
``kept_split`` (what it splits t ways) and ``checkpoint`` (what full activation
recomputation keeps: each layer's or block's input; None where recomputation has nothing
to drop). :mod:`coursekit.memory.accounting` turns a shape into bytes per GPU.

Presets: :func:`mlp_shape` (chapter 1's MLP), :func:`transformer_shape` (GPT-style;
:data:`PRESETS` has GPT-2 small and a 7B model) and :data:`RESNET50`.
"""

from __future__ import annotations

from dataclasses import dataclass

from coursekit import checks
from coursekit.nn import flops, layout
from coursekit.nn.mlp import MLP

__all__ = ["Kept", "ModelShape", "PRESETS", "RESNET50", "mlp_shape", "transformer_shape"]


@dataclass(frozen=True)
class Kept:
    """Activation storage: ``values`` numbers at the activation precision + ``mask_bytes``."""

    values: int = 0
    mask_bytes: int = 0

    def __post_init__(self):
        checks.integer(self.values, "values", at_least=0)
        checks.integer(self.mask_bytes, "mask_bytes", at_least=0)

    def nbytes(self, itemsize: int) -> int:
        """values * itemsize + mask_bytes."""
        return self.values * itemsize + self.mask_bytes


@dataclass(frozen=True)
class ModelShape:
    """Ψ = ``n_params``, training FLOPs per sample, and the activations ONE sample keeps.

    ``kept`` is not split by tensor parallelism, ``kept_split`` is split t ways;
    ``checkpoint`` is what full recomputation keeps instead (None: the same as without).
    """

    name: str
    n_params: int
    flops_per_sample: float
    kept: Kept
    kept_split: Kept = Kept()
    checkpoint: Kept | None = None

    def __post_init__(self):
        checks.instance(self.name, "name", str)
        checks.integer(self.n_params, "n_params", at_least=1, hint=" (Ψ, the parameter count)")
        checks.real(self.flops_per_sample, "flops_per_sample", above=0)
        for field in ("kept", "kept_split"):
            checks.instance(getattr(self, field), field, Kept, " (coursekit.memory.Kept)")
        if self.checkpoint is not None:
            checks.instance(self.checkpoint, "checkpoint", Kept, " (or None)")


def mlp_shape(model) -> ModelShape:
    """Chapter 1's MLP (a :class:`~coursekit.nn.MLP` or its ``sizes`` n_0, ..., n_L).

    Ψ = sum_l n_l (n_{l-1} + 1). One row keeps what the backward reads (see
    :mod:`coursekit.nn.kernels_cpu`): the input X (for dW_1) and every output A^l
    (A^l is layer l+1's input, and sigma'(A^l) is written with A^l): n_0 + ... + n_L values.
    Recomputing a layer would drop nothing: a dense layer keeps only its input and output,
    its neighbours' inputs, so ``checkpoint`` is None (the pipeline executor's
    ``recompute=True`` checkpoints whole stages of k layers instead, which does drop the
    k-1 inner outputs: :mod:`coursekit.parallel.pipeline.execute`). Tensor parallelism as in
    :class:`~coursekit.parallel.tensor_parallel.TensorParallelMLP`: column-parallel layers
    (the 1st, 3rd, ...) leave each rank a slice of their output, the others' outputs and X
    are whole on every rank. FLOPs per row: 6 Ψ (the rule of :func:`step_time`; the exact
    matrix-product count, :func:`coursekit.nn.flops.mlp_step_flops`, is lower by the bias
    terms 6 sum_l n_l and the first layer's skipped input gradient 2 n_0 n_1).
    """
    sizes = model.sizes if isinstance(model, MLP) else layout.check_sizes(model)
    n_params = layout.n_params(sizes)
    outputs = sizes[1:]
    return ModelShape(f"MLP {'-'.join(map(str, sizes))}", n_params, 6.0 * n_params,
                      kept=Kept(sizes[0] + sum(outputs[1::2])),
                      kept_split=Kept(sum(outputs[0::2])))


def transformer_shape(name: str, *, layers: int, hidden: int, heads: int, seq: int, vocab: int,
                      positions: int = 0) -> ModelShape:
    """A GPT-style decoder (GPT-2's layout: biases, two LayerNorms a layer, tied embeddings).

    Ψ = L (12 h^2 + 13 h) + V h + P h + 2 h, with L layers, hidden size h, vocabulary V and
    P learned position embeddings (0 for rotary ones): 12 h^2 of attention (4 h^2) and MLP
    (8 h^2) weights, 13 h of their biases and LayerNorms, a final LayerNorm. FLOPs per
    sequence: 6 Ψ s (two per weight per token forward, four backward; Kaplan et al. 2020,
    leaving out the attention scores, 2 L s h per token forward).

    Activations per layer, one sequence of s tokens, a heads, 16-bit values (Korthikanti et
    al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Sec. 4):

    * attention 11 s h + 5 a s^2: QKV input 2sh, Q and K 4sh, V 2sh, output-projection input
      2sh, dropout mask sh; softmax output 2as^2, its dropout mask as^2 and output 2as^2;
    * MLP 19 s h: input 2sh, GeLU input 8sh, second linear's input 8sh, dropout mask sh;
    * two LayerNorm inputs 4 s h;

    34 s h + 5 a s^2 bytes = 2 (16 s h + 2 a s^2) values + (2 s h + a s^2) mask bytes. With
    tensor parallelism (no sequence parallelism) 4sh values and the 2sh masks of the
    LayerNorms, the QKV and MLP inputs and the two dropouts stay whole: s h (10 + 24/t +
    5 a s/(h t)) bytes, their formula for tensor parallelism. Full recomputation keeps each
    layer's input: 2 s h. Embeddings, the output layer and the loss are left out (they
    count them separately: a few percent).
    """
    for key, value in (("layers", layers), ("hidden", hidden), ("heads", heads), ("seq", seq),
                       ("vocab", vocab)):
        checks.integer(value, key, at_least=1)
    checks.integer(positions, "positions", at_least=0)
    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be a multiple of heads={heads} "
                         f"(each head has hidden/heads dimensions)")
    L, h, a, s = layers, hidden, heads, seq
    n_params = L * (12 * h * h + 13 * h) + vocab * h + positions * h + 2 * h
    return ModelShape(name, n_params, 6.0 * n_params * s,
                      kept=Kept(L * 4 * s * h, L * 2 * s * h),
                      kept_split=Kept(L * (12 * s * h + 2 * a * s * s), L * a * s * s),
                      checkpoint=Kept(L * s * h))


def _resnet50() -> ModelShape:
    """torchvision's ResNet-50 (v1.5: the stride sits on the 3x3 convolution), 224 x 224.

    Our own count, walking the layers. Ψ = 25,557,032: convolutions without biases, two
    per BatchNorm channel, the 2048 x 1000 classifier with biases. Kept per image: the
    input (3 x 224 x 224 = 150,528) and every layer's output once (each convolution,
    BatchNorm, ReLU, the max-pool, each residual add, the average pool and the logits):
    37,559,784 outputs, 37,710,312 values in all (75.4 MB in 16-bit, 151 MB in fp32).
    Frameworks keep about that (a convolution keeps its input, BatchNorm its input, an
    in-place ReLU its output). The outputs agree with torchsummary's printout for
    torchvision's ``resnet50()`` at (3, 224, 224), which reports the same Ψ and a
    "Forward/backward pass size" of 286.56 MB = 2 x outputs x 4 bytes / 2^20.
    Checkpointing every bottleneck block keeps the image, the 16 block inputs and the
    classifier head's input. Tensor parallelism splits none of it here (convolutional
    networks are trained data-parallel). FLOPs per image: the lecture's 3.9 GMACs forward, 2 FLOPs
    each, 3 passes (:data:`coursekit.nn.flops.CNN_WORKLOADS`).
    """
    side, channels = 224, 3
    params, kept = 0, channels * side * side  # the image is conv1's input
    checkpoint = kept

    def conv_bn(c_in, c_out, k, stride, side_in, relu):
        nonlocal params, kept
        side_out = (side_in + 2 * (k // 2) - k) // stride + 1
        params += k * k * c_in * c_out + 2 * c_out
        kept += (3 if relu else 2) * c_out * side_out * side_out  # conv, BN (, ReLU) outputs
        return side_out

    side = conv_bn(3, 64, 7, 2, side, relu=True)
    side = (side + 2 - 3) // 2 + 1  # 3x3 max-pool, stride 2, padding 1
    kept += 64 * side * side
    channels = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for block in range(blocks):
            checkpoint += channels * side * side  # the block's input
            s = stride if block == 0 else 1
            inner = conv_bn(channels, width, 1, 1, side, relu=True)
            inner = conv_bn(width, width, 3, s, inner, relu=True)
            inner = conv_bn(width, 4 * width, 1, 1, inner, relu=False)
            if block == 0:  # the projection shortcut
                conv_bn(channels, 4 * width, 1, s, side, relu=False)
            kept += 2 * 4 * width * inner * inner  # the residual add and its ReLU
            side, channels = inner, 4 * width
    checkpoint += channels * side * side  # the head's input
    params += channels * 1000 + 1000
    kept += channels + 1000  # average pool, logits
    macs = flops.CNN_WORKLOADS["ResNet 50"].total_macs
    return ModelShape("ResNet-50 (224x224)", params, flops.training_flops_per_sample(macs),
                      kept=Kept(kept), checkpoint=Kept(checkpoint))


RESNET50 = _resnet50()

PRESETS = {
    "gpt2-small": transformer_shape("GPT-2 small (124M)", layers=12, hidden=768, heads=12,
                                    seq=1024, vocab=50257, positions=1024),
    "gpt-7b-2k": transformer_shape("GPT 7B, s=2048", layers=32, hidden=4096, heads=32, seq=2048,
                                   vocab=32000),
    "gpt-7b-4k": transformer_shape("GPT 7B, s=4096", layers=32, hidden=4096, heads=32, seq=4096,
                                   vocab=32000),
    "resnet50": RESNET50,
}
"""Named shapes for the panel. The 7B rows have LLaMA-7B's dimensions but GPT's layout
(Ψ = 6.58e9; LLaMA's SwiGLU MLP and untied output layer make its own 6.74e9)."""
