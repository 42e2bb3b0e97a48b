"""Chapter 7's pictures on the simulator's own results: the efficiency curve and one step."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from coursekit.sim import resnet50  # noqa: E402
from coursekit.sim.step import simulate_step  # noqa: E402
from coursekit.viz import figure_problems  # noqa: E402
from coursekit.viz.at_scale import draw_step, plot_at_scale  # noqa: E402
from coursekit.sim.at_scale import GPU_COUNTS, AtScaleConfig, simulate_at_scale  # noqa: E402


def test_the_chosen_count_is_marked_on_the_curve_and_its_step_drawn_beside():
    r = simulate_at_scale(AtScaleConfig(gpus=256, fusion_bytes=16 << 20, jitter=0.05))
    fig = plot_at_scale(r, "ResNet-50")
    assert figure_problems(fig, cropped_to_content=False) == []
    ax_e, ax_t = fig.axes
    curve, mark = ax_e.lines
    assert curve.get_xdata().tolist() == list(GPU_COUNTS)
    np.testing.assert_allclose(curve.get_ydata(), 100 * r.curve["efficiency"])
    assert (mark.get_xdata()[0], mark.get_ydata()[0]) == (256, 100 * r.efficiency)
    assert f"{r.step.bucket_bytes.size} allreduce(s)" in ax_t.get_title()
    assert fig.get_suptitle() == "ResNet-50"


def test_a_step_has_one_bar_per_phase_and_one_per_bucket_in_ms():
    net = resnet50.case_study_network(4)
    step = simulate_step(resnet50.workload(batch=32, update_s=0.005), net, fusion_bytes=4 << 20)
    ax = Figure().subplots()
    draw_step(ax, step)
    bars = ax.patches
    assert len(bars) == 3 + step.bucket_bytes.size  # forward, backward, update; one per bucket
    comm = [b for b in bars if b.get_y() > 0.5]     # the second row: the allreduces
    np.testing.assert_allclose(sorted(b.get_x() for b in comm), 1e3 * np.sort(step.bucket_start_s))
    update = max((b for b in bars if b.get_y() < 0.5), key=lambda b: b.get_x())
    assert (update.get_x() + update.get_width()) == pytest.approx(1e3 * step.step_s)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["compute", "allreduce"]
    no_update = simulate_step(resnet50.workload(batch=32), net, fusion_bytes=4 << 20)
    ax = Figure().subplots()
    draw_step(ax, no_update)
    assert len(ax.patches) == 2 + no_update.bucket_bytes.size  # a zero-length phase draws no bar
