"""The chapter-3 panel and plots, driven headlessly on ThreadComm ranks."""

from dataclasses import replace

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from coursekit.data import load_digits  # noqa: E402
from coursekit.parallel.data_parallel import experiments as ex  # noqa: E402
from coursekit.parallel.data_parallel import DPConfig  # noqa: E402
from coursekit.parallel.data_parallel.results import StepBreakdown  # noqa: E402
from coursekit.parallel.data_parallel import train  # noqa: E402
from coursekit.cluster.runner import LocalRunner  # noqa: E402
from coursekit.viz import data_parallel as dpv  # noqa: E402
from coursekit.widgets import data_parallel as w  # noqa: E402

THREADS = LocalRunner(4)


@pytest.fixture(scope="module")
def data():
    d = load_digits()
    return (d.X_train[:256], d.y_train[:256]), (d.X_test, d.y_test)


BASE = DPConfig(sizes=(64, 16, 10), epochs=1, max_steps=12, publish_interval=0.01)


def test_panel_runs_with_the_controls_values(data):
    panel = w.DataParallelPanel(base=BASE, data=data[0], eval_data=data[1], runner=THREADS)
    panel.workers.value = 3
    panel.exchange.value = "allreduce"
    panel.algorithm.value = "recursive_doubling"
    panel.batch.value = 8
    panel.slow.value = 2.0
    panel.bucket.value = "8 KiB"
    panel.run_button.click()
    assert panel.wait(60), "the clicked run did not end"
    r = panel.result
    assert r is not None, panel.status.value
    assert (r.n_workers, r.config.batch_size, r.config.algorithm) == (3, 24, "recursive_doubling")
    assert (r.config.straggler_rank, r.config.slow_factor, r.config.bucket_bytes) == (0, 2.0, 8192)
    assert panel.progress.value == panel.progress.max == 11  # ceil(256 rows / 24)
    assert panel.plot.value[:4] == b"\x89PNG"
    parts = r.step_breakdown()
    assert panel.status.value.startswith(str(parts))
    assert panel.status.value.endswith("; 3 ranks on cpu")


def test_step_breakdown_parts_add_up_and_none_is_negative(data):
    r = train(THREADS, replace(BASE, straggler_rank=0, slow_factor=3.0), *data, workers=3)
    parts = r.step_breakdown()
    assert parts.step == pytest.approx(parts.compute + parts.communication + parts.other)
    assert min(parts.compute, parts.communication, parts.other) >= 0
    assert parts.step == pytest.approx(r.step_s.max(axis=0).mean())
    # a hand-made run: rank 0 computes 5 then exchanges 1; rank 1 computes 1 and waits 5.5
    fake = replace(r, step_s=np.array([[6.0], [6.5]]), compute_s=np.array([[5.0], [1.0]]))
    assert fake.step_breakdown() == StepBreakdown(6.5, 5.0, 1.0, 0.5)


def test_panel_reports_bad_settings_in_its_status(data):
    panel = w.DataParallelPanel(max_workers=4, base=BASE, data=data[0], runner=LocalRunner(2))
    panel.run_button.click()
    assert panel.wait(60), "the clicked run did not end"
    assert panel.result is None
    assert panel.status.value == "error: workers=4 but LocalRunner(2) has 2 ranks"
    assert not panel.run_button.disabled
    with pytest.raises(ValueError, match="max_workers"):
        w.DataParallelPanel(max_workers=0, data=data[0], runner=THREADS)
    with pytest.raises(ValueError, match="give cluster= .a started cluster. or runner="):
        w.DataParallelPanel(data=data[0])


def test_experiments_and_their_plots(data):
    (train_data, eval_data) = data
    sweep = ex.sweep_exchange(THREADS, BASE, train_data, [1, 2, 3], alpha=1e-5, beta=1e-9,
                              eval_data=eval_data)
    nbytes = 1210 * 4  # the 64-16-10 gradient in float32
    assert sweep.predicted_busiest_bytes["ps"].tolist() == [0, 2 * nbytes, 4 * nbytes]
    np.testing.assert_allclose(sweep.busiest_bytes["ps"], sweep.predicted_busiest_bytes["ps"])
    grid = ex.lr_rule_grid(THREADS, BASE, train_data, [1, 2], ("constant", "linear"),
                           per_worker_batch=8, eval_data=eval_data)
    assert grid.accuracy.shape == (2, 2) and np.isfinite(grid.accuracy).all()
    strag = ex.straggler_sweep(THREADS, BASE, train_data, 2, [1.0, 3.0])
    assert strag.straggler_compute[1] > strag.others_compute[1]
    sc = ex.weak_scaling(THREADS, replace(BASE, batch_size=8), train_data, [1, 2], alpha=1e-5,
                    beta=1e-9)
    assert sc.efficiency[0] == 1 and sc.predicted_comm[0] == 0
    for fig in (dpv.plot_exchange_sweep(sweep), dpv.plot_lr_grid(grid), dpv.plot_straggler(strag),
                dpv.plot_scaling(sc), dpv.plot_run(train(THREADS, BASE, *data, workers=2))):
        assert fig.axes and all(ax.get_xlabel() and ax.get_ylabel() for ax in fig.axes
                                if ax.get_yticklabels()[0].get_text() != "rank 0")


def test_the_panels_device_reaches_the_config_and_bad_ones_are_refused(data):
    panel = w.DataParallelPanel(base=BASE, data=data[0], device="auto", runner=THREADS)
    assert panel.config().device == "auto" and BASE.device == "cpu"
    with pytest.raises(ValueError, match="allowed: cpu, cuda, auto"):
        w.DataParallelPanel(base=BASE, data=data[0], device="gpu", runner=THREADS)


def test_the_panel_exposes_the_averaging_interval_for_local_sgd(data):
    """k (average_every) is enabled for exchange 'average' only and reaches the run: a rank
    sends the allreduce's bytes once every k steps (predict_bytes_sent, exact)."""
    from coursekit.nn.layout import n_params
    from coursekit.parallel.data_parallel.strategies import predict_bytes_sent

    panel = w.DataParallelPanel(base=replace(BASE, timeline_steps=4), data=data[0],
                                eval_data=data[1], runner=THREADS)
    assert panel.every.disabled and panel.config().average_every == 1
    panel.every.value = 4
    assert panel.config().average_every == 1  # allreduce: k does not apply
    panel.exchange.value = "average"
    assert not panel.every.disabled
    panel.workers.value = 2
    panel.batch.value = 8
    panel.run()
    r = panel.result
    assert r is not None, panel.status.value
    assert (r.config.exchange, r.config.average_every, r.n_workers) == ("average", 4, 2)
    want = predict_bytes_sent("average", "ring", 2, n_params(BASE.sizes) * 4, 4, average_every=4)
    np.testing.assert_array_equal(r.bytes_sent(), want * np.ones(2))  # 12 steps: 3 periods of 4
    panel.exchange.value = "ps"
    assert panel.every.disabled and panel.config().average_every == 1
