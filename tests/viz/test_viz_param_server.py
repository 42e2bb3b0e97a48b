"""Chapter 4's pictures: the live accuracy curves and the comparison of finished runs."""

import matplotlib
import numpy as np

matplotlib.use("Agg")

from coursekit.parallel.param_server import PSConfig, train  # noqa: E402
from coursekit.cluster.runner import LocalRunner  # noqa: E402
from coursekit.viz import figure_problems  # noqa: E402
from coursekit.viz.param_server import plot_live, plot_runs, plot_worker_timeline  # noqa: E402


def test_the_first_live_update_reads_well():
    # one or two points a fraction of a millisecond apart: a browser run drew a dozen
    # colliding 7-digit time ticks ('0.00055', '0.00060', ...) from the automatic limits
    for times in ([0.0006], [0.00055, 0.0007]):
        data = [{}, {"worker": 0, "t": times, "accuracy": [0.1] * len(times)}]
        assert figure_problems(plot_live(data, "live")) == []


def test_plots_show_every_run_and_a_lost_worker():
    result = train(LocalRunner(4), PSConfig(model="asp", steps=20, crash={0: 5},
                                            worker_timeout=0.3, eval_every=5))
    fig = plot_runs([result, result])
    assert len(fig.axes[0].lines) == 2
    assert any("lost at" in t.get_text() for t in fig.axes[3].texts)
    timeline = plot_worker_timeline(result)
    assert [t.get_text() for t in timeline.axes[0].get_yticklabels()] == [
        "worker 0", "worker 1", "worker 2"]


def test_runs_of_any_length_read_well():
    # CI's panel test: a run whose curve ended near 0.02 s drew eight colliding 6-digit time
    # ticks ('0.0000', '0.0025', ...) from the automatic limits
    result = train(LocalRunner(3), PSConfig(steps=30, eval_every=5, worker_timeout=2.0))
    t, applied, accuracy = result.curve()
    for span in [0.0195, *np.geomspace(1e-4, 100, 13)]:
        result.curve = lambda span=span: (t / t.max() * span, applied, accuracy)
        assert figure_problems(plot_runs([result])) == [], span
