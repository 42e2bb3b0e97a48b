"""Timelines draw one row per rank, one bar per traced message, one arrow per message."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402

from coursekit import collectives as C  # noqa: E402
from coursekit.comm import Message, run_local  # noqa: E402
from coursekit.parallel.spans import Span  # noqa: E402
from coursekit.viz import byte_label, color, match_messages, plot_timeline, time_unit  # noqa: E402


def ring_traces(p=4):
    def body(comm):
        comm.tracing = True
        C.allreduce(comm, np.ones(10, np.float32), check=False)
        return comm.trace
    return run_local(body, p, timeout=10)


def test_timeline_of_a_traced_ring_allreduce():
    traces = ring_traces(4)
    fig = plot_timeline(traces, title="ring")
    ax = fig.axes[0]
    bars = sum(len(c.get_paths()) for c in ax.collections)
    assert bars == sum(len(t) for t in traces) == 4 * 2 * 6  # 6 sends + 6 recvs per rank
    assert len(ax.texts) == 4 * 6  # one arrow per message
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in range(4)]
    assert ax.get_xlabel() in ("time [us]", "time [ms]")
    plt.close(fig)


def test_matching_is_fifo_per_tag():
    m = lambda op, t: Message(op, 0, 1, 5, 8, t, t + 1)  # noqa: E731
    pairs = match_messages([[m("send", 0), m("send", 2)], [m("recv", 1), m("recv", 3)]])
    assert [(s.t_start, r.t_start) for s, r in pairs] == [(0, 1), (2, 3)]


def test_spans_and_colours():
    fig = plot_timeline([[], []], spans=[Span(0, "compute", 0.0, 1.0), Span(1, "idle", 0.0, 0.5)])
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["compute", "idle"]
    plt.close(fig)
    with pytest.raises(TypeError, match=r"each of spans must be a Span \(coursekit.parallel.spans\); "
                                        r"got tuple"):
        plot_timeline([[]], spans=[(0, "compute", 0.0, 1.0)])
    with pytest.raises(ValueError, match="known:"):
        color("bogus")
    with pytest.raises(ValueError, match="at least one"):
        plot_timeline([])


def test_units():
    assert time_unit(1e-4) == ("us", 1e6) and time_unit(0.1) == ("ms", 1e3)
    assert time_unit(10) == ("s", 1.0)
    assert byte_label(64 * 2**20) == "64 MiB" and byte_label(100) == "100 B"
