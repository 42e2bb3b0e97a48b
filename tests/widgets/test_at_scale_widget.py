"""The chapter-7 panel, driven headlessly: controls -> the simulator's numbers, status, plot."""

import numpy as np
import pytest

from coursekit.sim import resnet50
from coursekit.sim.step import Stragglers, scaling
from coursekit.sim.at_scale import EPOCH_IMAGES, GPU_COUNTS, AtScaleConfig, simulate_at_scale
from coursekit.widgets.at_scale import AtScalePanel

PNG = b"\x89PNG\r\n\x1a\n"


def reference(gpus, algorithm, fusion_bytes, fp16, batch, jitter=0.0):
    """The same setting computed straight from coursekit.sim (what the panel must show)."""
    work = resnet50.workload(batch=batch)
    res = scaling(work, resnet50.case_study_network(1), [gpus // 8], algorithm=algorithm,
                  fusion_bytes=fusion_bytes, fp16=fp16,
                  stragglers=Stragglers(jitter=jitter) if jitter else None)
    return res["efficiency"][0], res["throughput"][0]


def test_default_panel_matches_the_pure_functions():
    panel = AtScalePanel()
    r = panel.result
    eff, thr = reference(1024, "hierarchical", 64 << 20, True, 64)
    assert r.gpus == 1024 and r.step.p == 1024
    assert r.efficiency == pytest.approx(eff) and r.images_per_s == pytest.approx(thr)
    assert r.minutes_90_epochs == pytest.approx(EPOCH_IMAGES / thr / 60)
    assert r.curve["gpus"].tolist() == list(GPU_COUNTS)
    assert f"{eff:.1%}" in panel.status.value and f"{thr:,.0f}" in panel.status.value
    assert f"90 epochs in {EPOCH_IMAGES / thr / 60:.1f} min" in panel.status.value
    assert panel.plot.value[:8] == PNG


@pytest.mark.slow  # five 2048-GPU simulations, each drawn and checked
def test_controls_change_the_result_consistently():
    panel = AtScalePanel()
    before_plot = panel.plot.value
    panel.gpus.value = 2048
    panel.batch.value = 32  # the case study at 2048 GPUs: the same 64K global batch
    eff, thr = reference(2048, "hierarchical", 64 << 20, True, 32)
    assert panel.result.efficiency == pytest.approx(eff)
    assert panel.result.step.samples == 2048 * 32
    assert panel.plot.value != before_plot
    assert "2048 GPUs" in panel.status.value

    panel.fp16.value = False  # FP32 gradients: twice the bytes on the wire
    assert panel.result.step.bucket_bytes.sum() == pytest.approx(4 * 25_557_032)
    assert panel.result.efficiency == pytest.approx(reference(2048, "hierarchical", 64 << 20, False, 32)[0])

    panel.fusion.value = 0  # one allreduce per tensor
    assert panel.result.step.bucket_bytes.size == 161
    hier = panel.result.efficiency
    panel.algorithm.value = "ring"  # flat ring, unfused: 2(p-1) latencies per tensor
    assert panel.result.efficiency == pytest.approx(reference(2048, "ring", 0, False, 32)[0])
    assert panel.result.efficiency < hier / 2


def test_more_gpus_never_raise_efficiency_and_stragglers_cost_more_at_scale():
    panel = AtScalePanel(gpus=8)
    eff = panel.result.curve["efficiency"]
    assert np.all(np.diff(eff[1:]) <= 1e-12)  # beyond one node, every doubling costs
    clean = panel.result.efficiency
    panel.jitter.value = 0.1
    assert panel.result.slowest > 1 and panel.result.efficiency < clean
    assert "slowest GPU" in panel.status.value
    small_loss = 1 - panel.result.efficiency / clean
    panel.gpus.value = 4096
    big = panel.result
    no_jitter = simulate_at_scale(AtScaleConfig(gpus=4096))
    assert 1 - big.efficiency / no_jitter.efficiency > small_loss  # the max of more draws
    assert big.slowest == pytest.approx(Stragglers(jitter=0.1).factors(4096).max())


@pytest.mark.parametrize("settings, error, message", [
    (dict(gpus=1000), ValueError, "gpus must be one of"),
    (dict(gpus=1024.0), TypeError, "gpus"),
    (dict(algorithm="star"), ValueError, r"unknown allreduce algorithm 'star'; allowed: \('ring'"),
    (dict(algorithm=1), TypeError, "algorithm"),
    (dict(fusion_bytes=-1), ValueError, r"fusion_bytes=-1: must be >= 0 \(the tensor-fusion"),
    (dict(fp16=1), TypeError, "fp16"),
    (dict(batch=0), ValueError, "batch"),
    (dict(jitter=-0.1), ValueError, "jitter"),
    (dict(network=[("inter_bandwidth", 1.0)]), TypeError, "network"),
])
def test_bad_settings_are_refused_by_the_config(settings, error, message):
    with pytest.raises(error, match=message):
        AtScaleConfig(**settings)


def test_the_experiment_takes_its_config_and_keeps_it():
    config = AtScaleConfig(gpus=256, algorithm="ring")
    result = simulate_at_scale(config)
    assert result.config is config and result.gpus == 256
    with pytest.raises(TypeError, match="config"):
        simulate_at_scale()  # one config, as every chapter takes
    with pytest.raises(TypeError, match="config must be"):
        simulate_at_scale({"gpus": 256})


def test_a_bad_network_is_an_error_in_the_panel():
    panel = AtScalePanel(network={"inter_bandwidth": -1.0})
    assert panel.result is None and panel.status.value.startswith("error:")
    assert "inter_bandwidth" in panel.status.value
