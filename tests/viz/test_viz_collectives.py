"""Chapter 2's picture on a hand-made timing: measured points beside the model's curve."""

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from coursekit.viz import figure_problems  # noqa: E402
from coursekit.viz.collectives import plot_timing  # noqa: E402


def test_time_and_busbw_in_ms_and_gb_per_s_with_the_setting_in_the_title():
    n = np.array([1 << 10, 1 << 14, 1 << 18, 1 << 22], float)
    predicted = 6 * 1e-5 + 1.5 * n * 1e-9  # ring allreduce on p=4: 2(p-1) alpha + 2(p-1)/p n beta
    timing = SimpleNamespace(collective="allreduce", algorithm="ring", p=4, nbytes=n,
                             measured=1.3 * predicted, predicted=predicted,
                             busbw_measured=1.5 * n / (1.3 * predicted), busbw_predicted=1.5 * n / predicted)
    fig = plot_timing(timing)
    assert figure_problems(fig, cropped_to_content=False) == []
    ax_t, ax_bw = fig.axes
    measured, model = ax_t.lines
    np.testing.assert_allclose(measured.get_ydata(), 1e3 * timing.measured)
    np.testing.assert_allclose(model.get_ydata(), 1e3 * predicted)
    np.testing.assert_allclose(ax_bw.lines[1].get_ydata(), timing.busbw_predicted / 1e9)
    assert (ax_t.get_xscale(), ax_t.get_yscale(), ax_bw.get_xscale()) == ("log", "log", "log")
    assert fig.get_suptitle() == "allreduce (ring) on 4 ranks"
