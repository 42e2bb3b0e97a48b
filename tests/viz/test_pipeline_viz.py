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
    res = simulate(schedule(name, 3, 6, chunks=v), t_f=1.0, t_i=1.0, t_w=1.0)
    fig = plot_schedule(res.timeline, title=name)
    ax = fig.axes[0]
    bars = ax.collections
    assert len(bars) == sum(len(spans) for spans in res.timeline)
    by_kind = {k: [b for b, s in zip(bars, (s for spans in res.timeline for s in spans)) if s.action.kind == k]
               for k in "FBIW"}
    for kind, colour in (("F", "forward"), ("B", "backward"), ("I", "input_grad"), ("W", "weight_grad")):
        assert all(np.allclose(b.get_facecolor()[0][:3], to_rgba(color(colour))[:3]) for b in by_kind[kind])
    split = name == "zb_h1"  # its backwards are I then W; the others run one B
    assert [len(by_kind[k]) for k in "BIW"] == ([0, 18, 18] if split else [18 * v, 0, 0])
    assert all(b.get_hatch() is not None for b in by_kind["W"])  # W reads in grey too
    assert sum(b.get_hatch() is not None for b in bars) == len(by_kind["W"])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:-1] == (["forward F", "input grad I", "weight grad W"] if split
                           else ["forward F", "full backward B"])
    idle = [p for p in ax.patches if np.allclose(p.get_facecolor()[:3], to_rgba(color("idle"))[:3])]
    assert len(idle) == 3 and all(p.get_width() == pytest.approx(res.total_time) for p in idle)
    assert ax.get_xlim()[1] == pytest.approx(res.total_time)
    assert ax.get_xlabel() == "time [time units]"
    assert "idle (bubble)" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)


def test_measured_timelines_say_their_unit():
    res = simulate(schedule("gpipe", 2, 2), t_f=1.0, t_i=1.0, t_w=1.0)
    fig = plot_schedule(res.timeline, unit="ms")
    assert fig.axes[0].get_xlabel() == "time [ms]"
    plt.close(fig)


def test_empty_timeline_is_an_error():
    with pytest.raises(ValueError, match="at least one rank"):
        plot_schedule([])
