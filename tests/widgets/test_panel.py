"""The panel base: Run / Stop, readable errors, a stopped or lost cluster and Restart.

The first tests use a toy panel in this process; the last ones a real 2-engine cluster.
Nothing here measures time: runs are held open with events and stopped on purpose.
"""

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import ipywidgets as widgets
import psutil
import pytest
from ipyparallel import interactive  # ship the engine functions by value
from ipyparallel.error import CompositeError, RemoteError

from coursekit import cluster
from coursekit.cluster import EngineError
from coursekit.comm import CommTimeout, call_with_comm, setup_comm
from coursekit.widgets.health import cluster_problem, error_message
from coursekit.widgets.panel import Panel, png, size_limit

PNG = b"\x89PNG\r\n\x1a\n"


class Toy(Panel):
    """Returns twice the slider; ``job`` (if set) runs instead, with the panel as argument."""

    def __init__(self, job=None, **kwargs):
        self.x = widgets.IntSlider(3, min=0, max=10, description="x")
        self.job, self.shown = job, []
        super().__init__([self.x], **kwargs)

    def compute(self):
        return self.job(self) if self.job else 2 * self.x.value

    def show(self, result):
        self.shown.append(result)
        self.say(f"result {result}")


def test_run_is_synchronous_and_shows_the_result():
    panel = Toy()
    assert panel.run() == 6 and panel.result == 6 and panel.shown == [6]
    assert panel.status.value == "result 6"
    assert not panel.run_button.disabled and panel.stop_button.disabled
    for widget, css in ((panel, "ck-panel"), (panel.run_button, "ck-run"),
                        (panel.stop_button, "ck-stop"), (panel.status, "ck-status"),
                        (panel.plot, "ck-plot"), (panel.progress, "ck-progress")):
        assert css in widget._dom_classes


def test_a_clicked_run_disables_run_and_enables_stop_until_it_ends():
    started, release = threading.Event(), threading.Event()

    def job(panel):
        started.set()
        assert release.wait(30)
        return "done"

    panel = Toy(job)
    panel.run_button.click()
    assert started.wait(30)
    assert panel.running and panel.run_button.disabled and not panel.stop_button.disabled
    assert panel.status.value == "running ..."
    panel.run_button.click()  # a second click while running starts nothing
    release.set()
    assert panel.wait(30)
    assert panel.result == "done" and panel.shown == ["done"]
    assert not panel.run_button.disabled and panel.stop_button.disabled


@pytest.mark.parametrize("error, expected", [
    (ValueError("hidden must be >= 4, got 2"), "error: hidden must be >= 4, got 2"),
    (TypeError("n must be an int"), "error: n must be an int"),
    (EngineError("fn failed on 2 engine(s):\n  rank 0: ValueError: no\n  rank 1: KeyError: 'x'"),
     "error: fn failed on 2 engine(s): rank 0: ValueError: no; rank 1: KeyError: 'x'"),
    (CommTimeout("rank 1 waited 10 s for a message from rank 0 (recv, tag 3)"),
     "error: rank 1 waited 10 s for a message from rank 0 (recv, tag 3)"),
    (TimeoutError("the run did not finish within 5 s"), "error: the run did not finish within 5 s"),
    (ZeroDivisionError("division by zero"), "error: ZeroDivisionError: division by zero"),
    (CompositeError("one or more exceptions", [
        ("ValueError", "bad shape", [], {"engine_id": 0}),
        ("CommTimeout", "rank 1 waited", [], {"engine_id": 1})]),
     "error: rank 0: ValueError: bad shape; rank 1: CommTimeout: rank 1 waited"),
    (CompositeError("one or more exceptions", [  # one line per distinct error
        ("Diverged", "at epoch 8", [], {"engine_id": e}) for e in (0, 1, 2, 3)]
        + [("KeyError", "'x'", [], {"engine_id": 5}), ("Diverged", "at epoch 8", [], {})]),
     "error: ranks 0-3: Diverged: at epoch 8; KeyError: 'x'"),
    (CompositeError("one or more exceptions", [
        ("ValueError", "no", [], {"engine_id": e}) for e in (3, 0, 2)]),
     "error: ranks 0, 2, 3: ValueError: no"),
])
def test_errors_become_one_line_in_the_status_and_nothing_is_printed(error, expected, capsys):
    def job(panel):
        raise error

    engines = SimpleNamespace(engine_ids=[0, 1, 2, 3])  # what maps engine ids to ranks
    assert "error: " + error_message(error, engines) == expected
    panel = Toy(job)
    assert panel.run() is None
    assert panel.status.value == "error: " + error_message(error) and panel.error is error
    assert not panel.run_button.disabled and panel.stop_button.disabled
    assert capsys.readouterr() == ("", "")


def test_long_messages_are_cut_and_html_is_not_interpreted():
    assert len(error_message(ValueError("x" * 5000))) == 600
    panel = Toy(lambda p: (_ for _ in ()).throw(ValueError("<b>m</b> < p & q")))
    panel.run()
    assert panel.status.value == "error: &lt;b>m&lt;/b> &lt; p &amp; q"
    remote = RemoteError("KeyboardInterrupt", "", [], {"engine_id": 7})
    assert error_message(remote) == "KeyboardInterrupt"


def test_stop_ends_a_local_run_at_its_next_progress_callback():
    steps = []

    def job(panel):
        for step in range(1, 10**6):
            panel.progress_to(step, 10**6)
            steps.append(step)
            time.sleep(0.01)
        return "never"

    panel = Toy(job)
    panel.run_button.click()
    while not steps:
        time.sleep(0.01)
    panel.stop_button.click()
    assert panel.wait(30)
    assert panel.result is None and panel.status.value == "stopped."
    assert 0 < len(steps) < 10**6 and panel.progress.value > 0


def test_live_data_moves_the_progress_bar_and_redraws_at_most_every_interval():
    drawn = []

    class Streaming(Toy):
        def draw_live(self, data):
            drawn.append(data)

    def job(panel):
        for step in range(1, 5):  # rank 0 reports nothing (a server); 1 and 2 are workers
            panel.on_data([{}, {"step": step, "total": 4}, {"step": step + 1, "total": 4}])
        return "ok"

    panel = Streaming(job, live_interval=3600)
    assert panel.run() == "ok"
    assert (panel.progress.value, panel.progress.max) == (4, 4)
    assert len(drawn) == 1  # the first update draws, the next ones are too soon


def test_auto_panels_run_on_every_change():
    panel = Toy(auto=True)
    panel.x.value = 5
    panel.x.value = 7
    assert panel.shown == [10, 14] and panel.status.value == "result 14"


def test_png_renders_a_figure_without_pyplot():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2), layout="constrained")  # a plain Figure would cut its tick labels off
    fig.subplots().plot([0, 1], [1, 0])
    assert png(fig)[:8] == PNG


# ---- a real cluster -------------------------------------------------------------------------

@interactive
def busy_allreduce(comm, seconds, started):
    """Touch the file ``started``, then ring allreduces for ``seconds`` s (a long run to
    stop); return the last sum."""
    import time
    from pathlib import Path

    import numpy as np

    from coursekit.collectives import allreduce

    Path(started).touch()
    end = time.monotonic() + seconds
    while True:
        total = allreduce(comm, np.full(4096, comm.rank + 1.0), algorithm="ring")
        if time.monotonic() > end:
            return float(total[0])


class EnginePanel(Panel):
    """Runs ``busy_allreduce`` on the engines of its cluster for ``seconds.value`` s."""

    def __init__(self, c, started: Path, **kwargs):
        self.seconds = widgets.FloatSlider(0.0, min=0, max=120, description="seconds")
        self.started = started
        super().__init__([self.seconds], cluster=c, **kwargs)

    def compute(self):
        return self.cluster.run(call_with_comm, busy_allreduce, self.seconds.value,
                                str(self.started), timeout=120)

    def show(self, result):
        self.say(f"sums {result}")


def wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def fresh_comm(c):
    setup_comm(c, timeout=10)


@pytest.fixture
def two_engines(start_cluster):
    """Start a 2-engine cluster of the test's own (it kills or stops it)."""
    return lambda: start_cluster(n=2)


@pytest.mark.cluster
def test_stop_interrupts_the_engines_and_they_stay_usable(two_engines, tmp_path):
    c = two_engines()
    setup_comm(c, timeout=10)
    started = tmp_path / "started"
    panel = EnginePanel(c, started, prepare=fresh_comm)
    panel.seconds.value = 120
    panel.run_button.click()
    wait_for(started)
    panel.stop_button.click()
    assert panel.wait(30), "Stop did not end the run"
    assert panel.status.value == "stopped." and panel.result is None
    assert "KeyboardInterrupt" in str(panel.error)  # the engines were interrupted
    panel.seconds.value = 0
    assert panel.run() == [3.0, 3.0]  # the same engines, a fresh comm: a correct allreduce
    assert panel.status.value == "sums [3.0, 3.0]"


@interactive
def allreduce_alone(comm):
    """Rank 0 sums with a rank that never comes (its comm times out and breaks); the others
    return at once."""
    import numpy as np

    from coursekit.collectives import allreduce

    if comm.rank != 0:
        return None
    return float(allreduce(comm, np.ones(4), algorithm="ring")[0])


@pytest.mark.cluster
def test_a_run_whose_comm_broke_off_leaves_the_engines_ready_for_the_next(two_engines, tmp_path):
    c = two_engines()
    setup_comm(c, timeout=1)
    panel = EnginePanel(c, tmp_path / "started", prepare=fresh_comm)
    panel.compute = lambda: panel.cluster.run(call_with_comm, allreduce_alone, timeout=60)
    assert panel.run() is None and panel.status.value.startswith("error: ")
    assert "CommTimeout" in str(panel.error)
    del panel.compute  # the panel's own: both ranks sum
    assert panel.run() == [3.0, 3.0]  # the broken comm was rebuilt: a correct allreduce
    assert panel.status.value == "sums [3.0, 3.0]"


@pytest.mark.cluster
@pytest.mark.parametrize("victim", ["engine", "controller"])
def test_a_cluster_that_dies_during_a_run_offers_a_restart(two_engines, victim, tmp_path):
    c = two_engines()
    setup_comm(c, timeout=10)
    engine_pids = c.run(os.getpid)
    started = tmp_path / "started"
    panel = EnginePanel(c, started, restart=two_engines, prepare=fresh_comm)
    assert panel.restart_button.layout.display == "none"
    panel.seconds.value = 120
    panel.run_button.click()
    wait_for(started)
    controller = c.ipp_cluster.controller.process
    connection_files = list(Path(c.ipp_cluster.profile_dir, "security").glob(
        f"ipcontroller-{c.ipp_cluster.cluster_id}-*.json"))
    if victim == "engine":
        psutil.Process(engine_pids[1]).kill()
    else:  # the controller and its schedulers (they would outlive it as orphans)
        for process in [*controller.children(recursive=True), controller]:
            process.kill()
    assert panel.wait(30), "the panel kept waiting for a dead cluster"
    assert panel.status.value.startswith("the cluster is gone (")
    assert "Restart" in panel.status.value and panel.restart_button.layout.display is None
    assert not panel.run_button.disabled
    panel.restart_button.click()
    assert panel.cluster is not c and cluster_problem(panel.cluster) is None
    assert cluster_problem(c) == "it was stopped"  # the old one is cleaned up
    assert panel.restart_button.layout.display == "none"
    panel.seconds.value = 0
    assert panel.run() == [3.0, 3.0]  # the new cluster, prepared: it has a comm
    for path in connection_files:  # a killed controller cannot remove its own
        path.unlink(missing_ok=True)


@pytest.mark.cluster
def test_run_on_a_stopped_cluster_says_so_at_once(two_engines, tmp_path):
    c = two_engines()
    panel = EnginePanel(c, tmp_path / "started")
    c.stop()
    assert panel.run() is None
    assert panel.status.value.startswith("the cluster is gone (it was stopped): start a new one")
    assert panel.restart_button.layout.display == "none"  # no restart callback was given



def chapter_panels():
    """One panel of every chapter, built cheaply (no cluster: ThreadComm or simulations)."""
    from coursekit.costmodel import LinkFit
    from coursekit.cluster.runner import LocalRunner
    from coursekit.widgets.at_scale import AtScalePanel
    from coursekit.widgets.backprop import BackpropPanel
    from coursekit.widgets.collectives import CollectivesPanel
    from coursekit.widgets.compression import CompressionPanel
    from coursekit.widgets.data_parallel import DataParallelPanel
    from coursekit.widgets.param_server import ParamServerPanel
    from coursekit.widgets.pipeline import PipelinePanel

    threads, link = LocalRunner(3), LinkFit(1e-5, 1e-9)
    return [BackpropPanel(), CollectivesPanel(link=link, runner=threads),
            DataParallelPanel(data=None, runner=threads), ParamServerPanel(runner=threads),
            PipelinePanel(), CompressionPanel(link=link, runner=threads),
            AtScalePanel()]


def test_every_chapter_panel_has_the_same_layout():
    for panel in chapter_panels():
        assert isinstance(panel, Panel), type(panel).__name__
        controls, bar, status, *_, plot = panel.children
        assert bar.children[:2] == (panel.run_button, panel.stop_button)
        assert bar.children[-2:] == (panel.restart_button, panel.progress)
        assert (status, plot) == (panel.status, panel.plot)
        assert all(isinstance(column, widgets.VBox) for column in controls.children)


def test_size_limits_come_from_the_cluster_or_are_checked():
    assert size_limit("max_ranks", None, SimpleNamespace(size=4)) == 4
    assert size_limit("max_workers", None, None, default=4) == 4
    assert size_limit("max_ranks", 3, SimpleNamespace(size=4)) == 3
    with pytest.raises(ValueError, match="max_ranks must be an int >= 2, got 1"):
        size_limit("max_ranks", 1, None, minimum=2)
    with pytest.raises(ValueError, match="max_workers must be a positive int, got True"):
        size_limit("max_workers", True, None)
    with pytest.raises(ValueError, match=r"give cluster= \(a started cluster\) or runner="):
        from coursekit.widgets.param_server import ParamServerPanel
        ParamServerPanel()


def test_an_empty_plot_is_hidden_not_shown_broken():
    import ipywidgets as widgets

    from coursekit.widgets.panel import hide_when_empty

    image = hide_when_empty(widgets.Image(format="png"))
    assert image.layout.display == "none"
    image.value = b"\x89PNG fake"
    assert image.layout.display is None
    image.value = b""
    assert image.layout.display == "none"
