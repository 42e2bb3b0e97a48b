"""FLOP counts, the lecture's CNN table and the ResNet-50 minimum-time arithmetic (chapter 1)."""

import numpy as np
import pytest

from coursekit.nn import flops


def count_matmul_flops(sizes, batch, first_input_grad=False):
    """Independent count: walk the products backprop performs and add 2 m n k for each."""
    shapes = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        shapes.append((batch, n_in, n_out))  # Z = A_prev W
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        shapes.append((n_in, batch, n_out))  # dW = A_prev^T delta
        if i > 0 or first_input_grad:
            shapes.append((batch, n_out, n_in))  # G_prev = delta W^T
    return sum(2 * m * k * n for m, k, n in shapes)


@pytest.mark.parametrize("sizes, batch", [((64, 128, 10), 32), ((784, 256, 10), 256), ((3, 5, 7, 2), 1)])
def test_mlp_step_flops_counts_every_product(sizes, batch):
    f = flops.mlp_step_flops(sizes, batch)
    assert f["total"] == count_matmul_flops(sizes, batch)
    assert f["forward"] == 2 * batch * sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
    assert f["total"] == f["forward"] + f["backward"]


@pytest.mark.parametrize("sizes, batch", [((64, 128, 10), 32), ((784, 256, 10), 256), ((3, 5, 7, 2), 1)])
def test_mlp_step_flops_with_the_first_layers_input_gradient(sizes, batch):
    f = flops.mlp_step_flops(sizes, batch, first_input_grad=True)
    assert f["total"] == count_matmul_flops(sizes, batch, first_input_grad=True)
    assert f["backward"] == 2 * f["forward"]


def test_backward_is_about_forward_when_the_first_layer_dominates():
    """Chapter 1's 784-256-10 net: the first layer holds 98.7% of the MACs, and its input
    gradient is not needed, so backward ~ 1.01x forward and a step ~ 2x forward, not 3x."""
    f = flops.mlp_step_flops((784, 256, 10), 256)
    assert f["backward"] / f["forward"] == pytest.approx(1.013, abs=0.001)
    assert f["total"] == pytest.approx(209e6, rel=0.01)
    ref = flops.mlp_step_flops((784, 256, 10), 256, first_input_grad=True)
    assert ref["total"] == pytest.approx(312e6, rel=0.01)
    # a deep net of equal widths: backward -> 2x forward as the first layer's share shrinks
    deep = flops.mlp_step_flops((100,) * 11, 8)
    assert deep["backward"] / deep["forward"] == pytest.approx(1.9)


def test_mlp_step_flops_rejects_bad_batch():
    with pytest.raises(ValueError, match="batch=0"):
        flops.mlp_step_flops((3, 2), 0)
    with pytest.raises(TypeError, match="first_input_grad"):
        flops.mlp_step_flops((3, 2), 1, first_input_grad="yes")


def test_cnn_table_totals_add_up():
    for w in flops.CNN_WORKLOADS.values():
        assert w.conv_macs + w.fc_macs == pytest.approx(w.total_macs, rel=0.03), w.name
        assert w.conv_weights + w.fc_weights == pytest.approx(w.total_weights, rel=0.04), w.name


def test_fc_macs_from_layer_widths_show_the_slide_swap():
    """At batch 1 a dense layer's MACs equal its weights: VGG-16 ~124M, Overfeat fast ~130M."""
    vgg = 25088 * 4096 + 4096 * 4096 + 4096 * 1000
    assert flops.dense_macs(flops.VGG16_FC) == vgg
    table = flops.CNN_WORKLOADS
    assert vgg == pytest.approx(table["VGG 16"].fc_weights, rel=0.01)
    assert flops.dense_macs(flops.OVERFEAT_FAST_FC) == pytest.approx(table["Overfeat fast"].fc_weights, rel=0.01)
    # as printed, the FC MACs row has the two values swapped
    assert table["VGG 16"].fc_macs == table["Overfeat fast"].fc_weights


def test_resnet50_minimum_time_is_the_lectures_arithmetic():
    run = flops.RESNET50_IMAGENET
    assert run.flops_per_sample == pytest.approx(2 * 11.7e9)  # 11.7 GMACs forward + backward
    assert run.flops_per_epoch == pytest.approx(2 * 11.7e9 * 1.28e6)  # ~30,000 TFLOP
    assert run.flops_per_epoch / 1e12 == pytest.approx(30_000, rel=0.01)
    t_min = flops.minimum_training_time(run, 112e12)
    assert t_min == pytest.approx(30_000e12 * 90 / 112e12, rel=0.01)  # ~24,000 s
    assert t_min / 3600 == pytest.approx(6.7, abs=0.05)
    t_real = flops.time_at_throughput(run, 1457)
    assert t_real == pytest.approx(90 * 1.28e6 / 1457)  # ~79,000 s
    assert t_real / 3600 == pytest.approx(22, abs=0.1)
    with pytest.raises(ValueError, match="peak_flops=0"):
        flops.minimum_training_time(run, 0)


def test_roofline_and_intensity():
    n = 1024
    assert flops.matmul_intensity(n, n, n, 4) == pytest.approx(2 * n**3 / (4 * 3 * n * n))
    hw = flops.Hardware("toy", peak_flops=100.0, bandwidth=10.0)
    intensities = np.array([0.5, 5, 10, 50])
    got = [flops.attainable_flops(hw, i) for i in intensities]
    np.testing.assert_allclose(got, np.minimum(100, 10 * intensities))
    for h in flops.HARDWARE.values():
        ridge = h.peak_flops / h.bandwidth  # FLOPs per byte where compute starts to bind
        assert flops.attainable_flops(h, ridge * 2) == h.peak_flops
        assert flops.attainable_flops(h, ridge / 2) == pytest.approx(h.peak_flops / 2)


def test_roofline_ridges_and_where_the_chapters_products_sit():
    """Chapter 1 section 7: a 256x784x256 fp32 product (55 FLOP/B) is left of the V100's
    tensor-core ridge (112e12 / 900e9 ~ 124): memory-bound there; 4096^3 is right of all."""
    v100 = flops.HARDWARE["NVIDIA V100 PCIe (fp16 tensor cores)"]
    assert v100.ridge == pytest.approx(112e12 / 900e9)
    assert round(v100.ridge) == 124
    mid = flops.matmul_intensity(256, 784, 256)
    assert round(mid) == 55 and mid < v100.ridge
    assert mid > flops.HARDWARE["NVIDIA V100 PCIe (fp32)"].ridge
    assert flops.matmul_intensity(256, 784, 256, itemsize=2) < v100.ridge  # even in fp16
    assert all(flops.matmul_intensity(4096, 4096, 4096) > h.ridge for h in flops.HARDWARE.values())
