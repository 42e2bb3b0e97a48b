"""The ResNet-50 case study: the architecture's published counts and the slide's arithmetic."""

import pytest

from coursekit.sim import resnet50
from coursekit.sim.step import simulate_step


def test_resnet50_counts():
    table = resnet50.layers()
    assert sum(sum(layer.tensors) for layer in table) == 25_557_032  # torchvision resnet50
    assert sum(len(layer.tensors) for layer in table) == 161
    assert sum(1 for layer in table if layer.name.endswith(".bn")) == 53
    conv_weights = sum(layer.tensors[0] for layer in table if layer.macs and layer.name != "fc")
    assert conv_weights / 1e6 == pytest.approx(23.5, abs=0.05)  # lecture table: 23.5M
    conv_macs = sum(layer.macs for layer in table if layer.name != "fc")
    assert conv_macs / 1e9 == pytest.approx(3.86, abs=0.005)  # lecture table: 3.86G


def test_workload_is_calibrated_to_218_images_per_second():
    w = resnet50.workload(batch=64, images_per_s=218)
    assert w.compute_s == pytest.approx(64 / 218)
    assert w.grad_bytes.sum() == 4 * 25_557_032
    assert w.backward_s.sum() == pytest.approx(2 * w.forward_s)
    assert w.grad_bytes[:2].tolist() == [4 * 1000, 4 * 2048 * 1000]  # fc bias, then weight


def test_slide_arithmetic():
    rows = {r["claim"][:12]: r for r in resnet50.slide_arithmetic()}
    assert len(rows) == 5
    text = " ".join(r["check"] + " " + r["consistent"] for r in rows.values())
    assert "27,904" in text and "92.1%" in text and "98.6%" in text
    assert "221,446" in text and "8.7 min" in text and "110%" in text


def test_the_slides_figures_give_the_papers_own_time_on_1024_gpus():
    """99.2% of 1024 x 218 images/s trains 90 epochs in the 8.7 minutes of Jia et al.'s table."""
    cs = resnet50.CASE_STUDY
    images_per_s = cs["efficiency_1024"] * 1024 * cs["images_per_s_per_gpu"]
    minutes = cs["epochs"] * cs["imagenet_train_images"] / images_per_s / 60
    assert minutes == pytest.approx(cs["minutes_1024"], abs=0.05)
    assert cs["minutes_1024"] / cs["minutes_2048"] == pytest.approx(1.32, abs=0.005)


def test_two_thousand_gpus_gain_less_than_linear():
    """At fixed 64K global batch, 2048 GPUs get 32 images each: efficiency must drop."""
    w = resnet50.workload()
    s1024 = simulate_step(w, resnet50.case_study_network(128), algorithm="hierarchical",
                          fp16=True)
    s2048 = simulate_step(w.scaled(32), resnet50.case_study_network(256),
                          algorithm="hierarchical", fp16=True)
    gain = s2048.throughput / s1024.throughput
    assert 1.0 < gain < 2.0
    assert s2048.exposed_comm_s > s1024.exposed_comm_s


def test_unfused_flat_ring_collapses_at_1024():
    w = resnet50.workload()
    net = resnet50.case_study_network(128)
    unfused = simulate_step(w, net, algorithm="ring", fusion_bytes=0)
    fused = simulate_step(w, net, algorithm="ring", fusion_bytes=64 * 2**20)
    assert unfused.step_s > 5 * fused.step_s
    assert unfused.bucket_bytes.size == 161
