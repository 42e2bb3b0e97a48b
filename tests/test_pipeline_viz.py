"""The schedule timeline draws one bar per compute action, coloured by the course palette."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from coursekit.parallel.pipeline import schedule, simulate  # noqa: E402
from coursekit.viz.pipeline import plot_schedule  # noqa: E402
from coursekit.viz.style import color  # noqa: E402


@pytest.mark.parametrize("name,v", [("1f1b", 1), ("zb_h1", 1), ("interleaved_1f1b", 2)])
def test_one_bar_per_action(name, v):
    res = simulate(schedule(name, 3, 6, chunks=v), t_f=1.0, t_b=1.0, t_w=1.0)
    fig = plot_schedule(res.timeline, title=name)
    ax = fig.axes[0]
    bars = ax.collections
    assert len(bars) == sum(len(spans) for spans in res.timeline)
    forward = [b for b, s in zip(bars, (s for spans in res.timeline for s in spans)) if s.action.kind == "F"]
    assert all(np.allclose(b.get_facecolor()[0][:3], to_rgba(color("forward"))[:3]) for b in forward)
    hatched = sum(b.get_hatch() is not None for b in bars)
    assert hatched == (18 if name == "zb_h1" else 0)  # the W bars
    assert ax.get_xlim()[1] == pytest.approx(res.total_time)
    plt.close(fig)


def test_empty_timeline_is_an_error():
    with pytest.raises(ValueError, match="at least one rank"):
        plot_schedule([])
