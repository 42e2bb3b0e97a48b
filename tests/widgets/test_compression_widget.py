"""The chapter-6 panel driven headlessly, and INT8 inference."""

import numpy as np
import pytest

from coursekit.costmodel import LinkFit
from coursekit.data import load_digits
from coursekit.nn import MLP, train as train_serial
from coursekit.parallel.compression.experiment import CompressionConfig, train
from coursekit.parallel.compression.inference import int8_report, quantize_mlp, quantize_symmetric
from coursekit.parallel.compression import predict_seconds
from coursekit.cluster.runner import LocalRunner
from coursekit.widgets.compression import VALUES, CompressionPanel, exchange_comparison

ALPHA, BETA = 50e-6, 1 / 1.5e9
LINK = LinkFit(ALPHA, BETA)
THREADS = LocalRunner(4)


def test_run_button_calls_the_experiment_with_the_controls():
    calls = []

    def experiment(runner, setup, **kwargs):
        calls.append((runner, setup, kwargs["workers"]))
        return train(runner, setup, **kwargs)

    panel = CompressionPanel(link=LINK, max_workers=3, epochs=2, seed=4,
                             experiment=experiment, runner=THREADS)
    panel.compressor.value = "qsgd"
    assert panel.value.description == "levels" and panel.value.value == 4
    panel.value.value = 16
    panel.error_feedback.value = False
    panel.workers.value = 2
    panel.run_button.click()
    assert panel.wait(60), "the clicked run did not end"
    assert calls == [(THREADS, CompressionConfig("qsgd", 16, False, epochs=2, seed=4), 2)]
    result = panel.results[-1]
    assert result.p == 2 and len(result.test_accuracy) == 2
    assert f"{result.final_accuracy:.1%}" in panel.status.value
    assert panel.status.value.endswith(exchange_comparison(result, ALPHA, BETA) + "; 2 ranks on cpu")
    steps = result.steps_per_epoch * 2
    plain = steps * predict_seconds("allreduce", 2, 4 * result.n_params, ALPHA, BETA)
    assert f"over the run's {steps} steps" in panel.status.value
    assert f"vs {plain * 1e3:.3g} ms for a float32 allreduce" in panel.status.value
    assert panel.plot.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert not panel.run_button.disabled


def test_parameterless_compressors_disable_the_value_slider_and_runs_accumulate():
    panel = CompressionPanel(link=LINK, max_workers=2, epochs=1, runner=THREADS)
    panel.compressor.value = "sign"
    assert panel.value.disabled and panel.config().value is None
    panel.run_button.click()
    assert panel.wait(60), "the clicked run did not end"
    panel.compressor.value = "powersgd"
    assert not panel.value.disabled and panel.value.options[0] == ("1", 1)
    panel.run_button.click()
    assert panel.wait(60), "the clicked run did not end"
    assert [r.config.label for r in panel.results] == ["sign + EF", "powersgd rank=2 + EF"]
    panel.clear_button.click()
    assert panel.results == [] and panel.plot.value == b""


def test_error_feedback_is_on_by_default_for_biased_compressors_only():
    panel = CompressionPanel(link=LINK, max_workers=2, runner=THREADS)
    defaults = {}
    for name in ("topk", "qsgd", "sign", "terngrad", "powersgd", "randomk", "uniform"):
        panel.compressor.value = name
        defaults[name] = panel.error_feedback.value
    assert defaults == {"topk": True, "qsgd": False, "sign": True, "terngrad": False,
                        "powersgd": True, "randomk": False, "uniform": True}


@pytest.mark.slow  # two 10-epoch trainings of 4 workers, each drawn
def test_qsgd_with_error_feedback_diverges_with_one_readable_error():
    panel = CompressionPanel(link=LINK, max_workers=4, epochs=10, runner=THREADS)
    panel.compressor.value = "qsgd"
    panel.error_feedback.value = True
    assert panel.run() is None
    status = panel.status.value
    assert "diverged at epoch " in status and "qsgd levels=4 + EF" in status
    assert "reaches 17.3 ||x||^2 on 4,810 parameters" in status
    assert "switch error feedback off" in status
    panel.error_feedback.value = False  # the default: it trains
    result = panel.run()
    assert result.final_accuracy > 0.85


def test_panel_reports_errors_in_the_status_line():
    def experiment(runner, setup, **kwargs):
        raise ValueError("p=3 workers but the cluster has 2 engines")

    panel = CompressionPanel(link=LINK, max_workers=3, experiment=experiment,
                             runner=THREADS)
    assert panel.run() is None
    assert panel.status.value.startswith("error: p=3 workers")
    assert panel.results == []


def test_every_value_choice_is_accepted():
    from coursekit.parallel.compression import COMPRESSORS, make_compressor
    for name, entry in COMPRESSORS.items():
        for value in VALUES.get(entry.param, (None,)):
            make_compressor(name, value if entry.param else None, rng=0, sizes=[64, 64, 10])


def test_bad_max_workers():
    with pytest.raises(ValueError, match="max_workers must be a positive int"):
        CompressionPanel(link=LINK, max_workers=0, runner=THREADS)


def test_a_link_without_alpha_and_beta_is_refused():
    with pytest.raises(TypeError, match=r"link must have \.alpha"):
        CompressionPanel(link={"alpha": ALPHA, "beta": BETA}, runner=THREADS)


# ---- INT8 inference ---------------------------------------------------------------------------

def test_symmetric_quantization_error_is_at_most_half_a_step_per_column():
    w = np.random.default_rng(0).standard_normal((50, 7)).astype(np.float32)
    w[:, 3] = 0  # an all-zero column keeps scale 1 and codes 0
    q, s = quantize_symmetric(w, axis=0)
    assert q.dtype == np.int8 and s.shape == (1, 7) and np.abs(q).max() <= 127
    assert np.all(np.abs(q * s - w) <= s / 2 + 1e-7)
    assert np.all(q[:, 3] == 0)


def test_int8_model_is_about_4x_smaller_and_as_accurate():
    data = load_digits()
    mlp = MLP([64, 64, 10], seed=0)
    train_serial(mlp, data.X_train, data.y_train, epochs=5)
    report = int8_report(mlp, data.X_test, data.y_test)
    n_w, n_b = 64 * 64 + 64 * 10, 64 + 10
    assert report.float_bytes == 4 * (n_w + n_b)
    assert report.int8_bytes == n_w + 4 * (64 + 10) + 4 * n_b  # weights, scales, biases
    assert report.float_accuracy > 0.9
    assert abs(report.int8_accuracy - report.float_accuracy) <= 0.01


def test_int8_forward_is_close_to_the_float_forward():
    data = load_digits()
    mlp = MLP([64, 32, 10], seed=1)
    out = quantize_mlp(mlp).forward(data.X_test[:50])
    ref = mlp.forward(data.X_test[:50])
    assert np.abs(out - ref).max() < 0.05 * np.abs(ref).max()


def test_the_panels_device_reaches_the_config_and_bad_ones_are_refused():
    panel = CompressionPanel(link=LINK, max_workers=2, device="auto", runner=THREADS)
    assert panel.config().device == "auto"
    with pytest.raises(ValueError, match="allowed: cpu, cuda, auto"):
        CompressionPanel(link=LINK, max_workers=2, device="gpu", runner=THREADS)
