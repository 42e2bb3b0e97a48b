"""How much arithmetic training takes, and the least time it can take.

Counting convention: one multiply-accumulate (MAC) is 2 floating-point operations (FLOPs).

MLP, one mini-batch of n rows, layer l with n_in inputs and n_out outputs:

* forward  Z = A_prev W          : 2 n n_in n_out FLOPs
* backward dW = A_prev^T delta   : 2 n n_in n_out
*          G_prev = delta W^T    : 2 n n_in n_out (not needed for the first layer)

so backward is about twice forward for a deep network (the lecture: "backward is about
twice forward", a step about 3x forward), but not for a shallow one whose first layer
dominates: the input gradient of the first layer is the gradient with respect to the data,
which training never needs. For 784-256-10 the first layer holds 98.7% of the MACs, so
backward is ~1.01x forward and a step ~2x forward. :func:`mlp_step_flops` counts the
products a step needs; ``first_input_grad=True`` adds the one that an implementation
computing ``delta W^T`` in every layer (the readable :mod:`coursekit.nn.reference`) does
and throws away. Elementwise work (bias, activation, softmax) is O(n n_out) and ignored.

The CNN table and the ResNet-50 arithmetic are the lecture's (sources: Sze et al.,
"Efficient processing of deep neural networks", Proc. IEEE 2017; Ben-Nun & Hoefler,
ACM CSUR 2019), kept here as data so the notebook can recompute them.
"""

from __future__ import annotations

from dataclasses import dataclass

from coursekit import checks
from coursekit.nn.layout import check_sizes

__all__ = [
    "CNN_WORKLOADS",
    "HARDWARE",
    "OVERFEAT_FAST_FC",
    "VGG16_FC",
    "RESNET50_IMAGENET",
    "CnnWorkload",
    "Hardware",
    "TrainingRun",
    "attainable_flops",
    "dense_macs",
    "matmul_intensity",
    "minimum_training_time",
    "mlp_step_flops",
    "time_at_throughput",
    "training_flops_per_sample",
]


def dense_macs(sizes) -> int:
    """MACs of one sample through fully connected layers ``sizes``: sum of n_in * n_out."""
    sizes = check_sizes(sizes)
    return sum(n_in * n_out for n_in, n_out in zip(sizes[:-1], sizes[1:]))


#: fully connected widths of two of the table's networks (flattened last feature map first)
VGG16_FC = (512 * 7 * 7, 4096, 4096, 1000)
OVERFEAT_FAST_FC = (1024 * 6 * 6, 3072, 4096, 1000)


def mlp_step_flops(sizes, batch: int, *, first_input_grad: bool = False) -> dict[str, int]:
    """Matrix-product FLOPs of one training step: {"forward", "backward", "total"}.

    forward = 2 n sum_l n_in n_out; backward = 2 * forward - 2 n n_0 n_1, since the first
    layer's input gradient delta W^T (a gradient with respect to the data) is not needed.
    ``first_input_grad=True`` counts it anyway (backward = 2 * forward): the work of an
    implementation that computes it, like :mod:`coursekit.nn.reference`.
    """
    sizes = check_sizes(sizes)
    batch = checks.integer(batch, "batch", at_least=1)
    first_input_grad = checks.boolean(first_input_grad, "first_input_grad")
    forward = 2 * batch * dense_macs(sizes)
    backward = 2 * forward
    if not first_input_grad:
        backward -= 2 * batch * sizes[0] * sizes[1]  # no G_prev = delta W^T for the first layer
    return {"forward": forward, "backward": backward, "total": forward + backward}


@dataclass(frozen=True)
class CnnWorkload:
    """One column of the lecture's table: MACs and weights of ONE forward pass of one image."""

    name: str
    input_size: int  # pixels per side
    conv_layers: int
    conv_weights: float
    conv_macs: float
    fc_layers: int
    fc_weights: float
    fc_macs: float
    total_weights: float
    total_macs: float
    top5_error: float | None  # percent, None where the table has n/a


#: The lecture's table (Sze et al. 2017), as printed on the slide. One slip: the FC MACs
#: of Overfeat fast and VGG 16 are printed as 124M and 130M, i.e. swapped. At batch 1 a
#: fully connected layer uses each weight in exactly one MAC, so FC MACs ~ FC weights:
#: ``dense_macs(VGG16_FC)`` = 123.6M and ``dense_macs(OVERFEAT_FAST_FC)`` = 129.9M.
CNN_WORKLOADS = {
    w.name: w
    for w in [
        CnnWorkload("LeNet 5", 28, 2, 2.6e3, 283e3, 2, 58e3, 58e3, 60e3, 341e3, None),
        CnnWorkload("AlexNet", 227, 5, 2.3e6, 666e6, 3, 58.6e6, 58.6e6, 61e6, 724e6, 16.4),
        CnnWorkload("Overfeat fast", 231, 5, 16e6, 2.67e9, 3, 130e6, 124e6, 146e6, 2.8e9, 14.2),
        CnnWorkload("VGG 16", 224, 13, 14.7e6, 15.3e9, 3, 124e6, 130e6, 138e6, 15.5e9, 7.4),
        CnnWorkload("GoogLeNet v1", 224, 57, 6.0e6, 1.43e9, 1, 1e6, 1e6, 7e6, 1.43e9, 6.7),
        CnnWorkload("ResNet 50", 224, 53, 23.5e6, 3.86e9, 1, 2e6, 2e6, 25.5e6, 3.9e9, 5.3),
    ]
}


def training_flops_per_sample(forward_macs: float, backward_factor: float = 2.0) -> float:
    """FLOPs to train on one sample: 2 * forward_macs * (1 + backward_factor)."""
    return 2 * forward_macs * (1 + backward_factor)


@dataclass(frozen=True)
class TrainingRun:
    """A training job: ``epochs`` passes over ``samples`` samples of ``flops_per_sample`` each."""

    name: str
    flops_per_sample: float
    samples: int
    epochs: int

    @property
    def flops_per_epoch(self) -> float:
        return self.flops_per_sample * self.samples

    @property
    def total_flops(self) -> float:
        return self.flops_per_epoch * self.epochs


#: The lecture's example: ResNet-50 (3.9 GMACs forward, so ~11.7 GMACs forward + backward
#: = 23.4 GFLOP per image), 90 epochs of ImageNet-2012's 1.28M training images:
#: 2 * 11.7e9 * 1.28e6 ~ 30,000 TFLOP per epoch.
RESNET50_IMAGENET = TrainingRun(
    "ResNet-50 / ImageNet", training_flops_per_sample(3.9e9), 1_280_000, 90
)


def minimum_training_time(run: TrainingRun, peak_flops: float) -> float:
    """Seconds if every FLOP ran at the device's peak: total_flops / peak_flops (a lower bound)."""
    if not peak_flops > 0:
        raise ValueError(f"peak_flops={peak_flops!r}: must be > 0")
    return run.total_flops / peak_flops


def time_at_throughput(run: TrainingRun, samples_per_second: float) -> float:
    """Seconds at a measured throughput: samples * epochs / samples_per_second.

    The lecture: MXNet trains ResNet-50 at ~1457 images/s on one V100 (batch 256),
    so 90 epochs take ~79,000 s ~ 22 h, against the 6.7 h minimum.
    """
    if not samples_per_second > 0:
        raise ValueError(f"samples_per_second={samples_per_second!r}: must be > 0")
    return run.samples * run.epochs / samples_per_second


@dataclass(frozen=True)
class Hardware:
    """Peak compute and memory bandwidth of a device (vendor figures unless ``measured``)."""

    name: str
    peak_flops: float  # FLOP/s
    bandwidth: float  # bytes/s
    note: str = ""

    @property
    def ridge(self) -> float:
        """FLOP/byte where the roofline turns: peak_flops / bandwidth. Left of it a kernel is
        memory-bound, right of it compute-bound."""
        return self.peak_flops / self.bandwidth


#: Devices the lectures quote. FLOP/s from the slides; bandwidths from the vendors' data
#: sheets (the slides give none). The slide's V100 figure, 112 TFLOP/s, is the fp16
#: tensor-core peak of the PCIe card (SXM2: 125); its fp32 peak is 14 (PCIe) to 15.7 (SXM2)
#: TFLOP/s, the line to read with :func:`matmul_intensity`'s default 4-byte operands.
#: The notebook adds this machine's measured values.
HARDWARE = {
    h.name: h
    for h in [
        Hardware("Intel Core i7-7700K", 540e9, 38.4e9, "slide: ~540 GFLOP/s FP32; 2 x DDR4-2400"),
        Hardware("NVIDIA GTX 1080 Ti", 11.4e12, 484e9, "slide: ~11.4 TFLOP/s FP32; GDDR5X"),
        Hardware("NVIDIA V100 PCIe (fp16 tensor cores)", 112e12, 900e9,
                 "slide: ~112 TFLOP/s, the fp16 tensor-core peak (SXM2: 125); HBM2"),
        Hardware("NVIDIA V100 PCIe (fp32)", 14e12, 900e9, "data sheet: 14 TFLOP/s FP32 (SXM2: 15.7); HBM2"),
    ]
}


def matmul_intensity(m: int, n: int, k: int, itemsize: int = 4) -> float:
    """Arithmetic intensity of C(m,n) = A(m,k) B(k,n): 2mnk FLOPs / bytes of A, B and C moved once."""
    return 2 * m * n * k / (itemsize * (m * k + k * n + m * n))


def attainable_flops(hardware: Hardware, intensity: float) -> float:
    """Roofline: min(peak FLOP/s, bandwidth * intensity) for a kernel of that FLOPs-per-byte."""
    return min(hardware.peak_flops, hardware.bandwidth * intensity)
