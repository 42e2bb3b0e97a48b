"""The lecture's case study: ResNet-50 on ImageNet with 1024-2048 GPUs (Jia et al. 2018).

Source: X. Jia, S. Song, W. He et al., "Highly Scalable Deep Learning Training System with
Mixed-Precision: Training ImageNet in Four Minutes", arXiv:1807.11205 (2018). Its abstract:
1024-2048 Tesla P40 GPUs, mini-batches up to 64K, all-reduce up to 11x faster than NCCL-based
training for ResNet-50, and 75.8% top-1 in 6.6 minutes (90 epochs) on 2048 P40. Its table
comparing ResNet-50 training with earlier work lists both of its runs, with the same 64K
batch: 1024 P40 in 8.7 minutes (76.2% top-1) and 2048 P40 in 6.6 minutes (75.8%). The lecture
(COMP4007 deck, "ResNet-50 on 1024 GPUs") adds: 8 P40 (PCIe) per node, 100 Gb/s RoCE,
TensorFlow + Horovod + NCCL + MPI, 218 images/s with batch 64 per GPU, 128 nodes, 99.2%
weak-scaling efficiency, and 7.8 vs 6.6 minutes for 1024 vs 2048 GPUs.

:func:`layers` derives ResNet-50 (v1: the stride sits on the first 1x1 convolution of a
block, He et al. 2016) from its definition: 25,557,032 parameters in 161 tensors (53
convolutions, 53 batch norms with two tensors each, the FC weight and bias) and 3.86 GMACs
per 224x224 image forward, the figures of the lecture's CNN table (Sze et al. 2017).
:func:`slide_arithmetic` checks the slide's numbers against each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks

from .network import Network
from .step import Workload

__all__ = ["CASE_STUDY", "Layer", "case_study_network", "layers", "slide_arithmetic",
           "workload"]

CASE_STUDY = {
    "imagenet_train_images": 1_281_167,  # ILSVRC-2012 training set
    "epochs": 90,
    "gpus_per_node": 8,                  # Tesla P40 over PCIe (lecture)
    "images_per_s_per_gpu": 218,         # P40, mixed precision, batch 64 per GPU (lecture)
    "batch_per_gpu": 64,
    "global_batch": 65_536,              # "up to 64K" (abstract): 64 x 1024, 32 x 2048
    "efficiency_1024": 0.992,            # lecture
    "minutes_2048": 6.6,                 # abstract of arXiv:1807.11205, and its table
    "minutes_1024": 8.7,                 # the paper's table: 1024 P40, 64K batch, 76.2% top-1
    "slide_minutes_1024": 7.8,           # lecture; see slide_arithmetic()
    "slide_images_per_s_128_nodes": 27_500,
    "slide_efficiency_numerator": 25_700,
    "inter_node_bits_per_s": 100e9,      # 100 Gb/s RoCE (Mellanox ConnectX-4)
}
"""Published and quoted figures of the case study (sources in the module docstring)."""


@dataclass(frozen=True)
class Layer:
    """One parameterized layer: its gradient tensors (element counts) and forward MACs/image."""

    name: str
    tensors: tuple[int, ...]
    macs: int


def _conv(name, c_in, c_out, k, hw_out):
    return [Layer(name, (c_in * c_out * k * k,), c_in * c_out * k * k * hw_out * hw_out),
            Layer(name + ".bn", (c_out, c_out), 0)]


def layers() -> list[Layer]:
    """ResNet-50 v1 for 224x224 inputs, in forward order."""
    out = _conv("conv1", 3, 64, 7, 112)
    c_in, hw = 64, 56  # after the 3x3 max-pool
    for stage, (blocks, width, stride) in enumerate([(3, 64, 1), (4, 128, 2), (6, 256, 2),
                                                     (3, 512, 2)], start=2):
        for b in range(blocks):
            s = stride if b == 0 else 1
            hw_out = hw // s
            name = f"conv{stage}_{b + 1}"
            out += _conv(name + "a", c_in, width, 1, hw_out)
            out += _conv(name + "b", width, width, 3, hw_out)
            out += _conv(name + "c", width, 4 * width, 1, hw_out)
            if b == 0:
                out += _conv(name + "_proj", c_in, 4 * width, 1, hw_out)
            c_in, hw = 4 * width, hw_out
    out.append(Layer("fc", (2048 * 1000, 1000), 2048 * 1000))
    return out


def workload(batch: int = 64, images_per_s: float = 218.0, update_s: float = 0.0) -> Workload:
    """One worker's step: FP32 gradient bytes in backward order; compute time per layer
    proportional to its MACs (backward = 2 x forward), scaled so that one worker trains
    ``images_per_s`` at this ``batch`` (batch norm and ReLU time folded into the convs)."""
    checks.integer(batch, "batch", at_least=1)
    checks.real(images_per_s, "images_per_s", above=0)
    step_s = batch / images_per_s
    checks.real(update_s, "update_s", at_least=0, below=step_s,
                hint=f" (less than the whole step, batch / images_per_s = {step_s:g} s)")
    table = layers()
    macs = np.array([layer.macs for layer in table], dtype=float)
    per_mac = (step_s - update_s) / (3 * macs.sum())
    grads, backward = [], []
    for layer, m in zip(reversed(table), macs[::-1]):
        for i, n in enumerate(reversed(layer.tensors)):
            grads.append(4 * n)
            backward.append(2 * m * per_mac if i == 0 else 0.0)
    return Workload("ResNet-50", np.array(grads), np.array(backward),
                    float(macs.sum() * per_mac), update_s, batch)


def case_study_network(nodes: int = 128, *, intra_bandwidth: float = 8e9,
                       intra_latency: float = 8e-6, inter_bandwidth: float = 10e9,
                       inter_latency: float = 10e-6) -> Network:
    """8 GPUs per node on PCIe, one 100 Gb/s RoCE NIC per node.

    Assumed effective figures (not from the paper): PCIe 3.0 x16 peaks at 15.75 GB/s but
    NCCL rings across PCIe switches reach about half; RoCE at 100 Gb/s = 12.5 GB/s line rate,
    about 10 GB/s achieved; latencies of a few microseconds per hop plus software.
    """
    return Network.from_bandwidths(CASE_STUDY["gpus_per_node"], nodes,
                                   intra_latency=intra_latency, intra_bandwidth=intra_bandwidth,
                                   inter_latency=inter_latency, inter_bandwidth=inter_bandwidth)


def slide_arithmetic() -> list[dict]:
    """The slide's figures against each other: one row per claim, with the consistent value.

    Each row: ``claim`` (as on the slide), ``check`` (the arithmetic), ``consistent`` (the
    value that agrees with the rest and with the paper's 6.6 minutes; the 8.7 minutes it
    derives for 1024 GPUs are the paper's own, ``CASE_STUDY["minutes_1024"]``), ``why``.
    """
    cs = CASE_STUDY
    per_gpu, images = cs["images_per_s_per_gpu"], cs["epochs"] * cs["imagenet_train_images"]
    ideal_1024 = per_gpu * 1024
    at_1024 = cs["efficiency_1024"] * ideal_1024
    minutes_1024 = images / at_1024 / 60
    at_2048 = images / (cs["minutes_2048"] * 60)
    per_node_reading = images / (per_gpu * 128) / 60
    return [
        {"claim": "218 images/s on one node (8 GPUs)",
         "check": f"90 epochs at 218 x 128 img/s would take {per_node_reading:.0f} min, "
                  f"not minutes",
         "consistent": f"218 img/s per GPU = {8 * per_gpu:,} img/s per node",
         "why": "only the per-GPU reading makes 90 epochs take minutes"},
        {"claim": "about 27,500 images/s on 128 nodes (1024 GPUs)",
         "check": f"218 x 128 = {per_gpu * 128:,}: per-GPU speed times NODES, not GPUs",
         "consistent": f"{at_1024:,.0f} img/s = 99.2% x 218 x 1024",
         "why": "the 1024 GPUs each do 218 img/s"},
        {"claim": "scaling efficiency 25700/218/128 = ~99.2%",
         "check": f"25,700/218/128 = {25_700 / per_gpu / 128:.1%}; "
                  f"27,500/218/128 = {27_500 / per_gpu / 128:.1%}",
         "consistent": f"efficiency = throughput / (1024 x 218) = 99.2% <=> "
                       f"{at_1024:,.0f} img/s",
         "why": "neither quoted numerator gives 99.2%; the ratio must use GPUs, not nodes"},
        {"claim": "90 epochs in 7.8 minutes on 1024 GPUs",
         "check": f"7.8 min needs {images / 468:,.0f} img/s = "
                  f"{images / 468 / ideal_1024:.0%} of 1024 x 218: impossible",
         "consistent": f"{minutes_1024:.1f} min at 99.2% efficiency",
         "why": "7.8 reads like 8.7 with the digits swapped; Jia et al.'s own table "
                f"gives {cs['minutes_1024']:g} min for 1024 P40"},
        {"claim": "2048 GPUs: 6.6 minutes, doubling the GPUs gained only 18%",
         "check": f"7.8/6.6 = {7.8 / 6.6:.2f}; with {minutes_1024:.1f} min: "
                  f"{minutes_1024 / 6.6:.2f}",
         "consistent": f"{minutes_1024 / 6.6 - 1:.0%} faster; {at_2048:,.0f} img/s = "
                       f"{at_2048 / (per_gpu * 2048):.0%} of 2048 x 218",
         "why": "the global batch stays 64K: 32 images per GPU at 2048, half the compute "
                "per step to hide the same allreduce behind"},
    ]
