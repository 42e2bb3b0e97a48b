"""Panels say when other users' work disturbs the timings (coursekit.cluster.contention).

A second client (another student on the same cluster) queues work on our engines, or
processes spin on the host: the measurement says disturbed and names why, fast (it never
waits behind the other client's task); the panel's notice line shows it and clears it."""

import multiprocessing
import time

import ipywidgets as widgets
import pytest
from ipyparallel import interactive  # ship the engine function by value

from coursekit.cluster.contention import BUSY_THRESHOLD, Contention, observe
from coursekit.widgets.panel import Panel


@pytest.fixture(scope="module")
def shared(cluster2):
    """Our cluster (the run's shared 2-engine one), and a second client of it (another
    student)."""
    other = cluster2.ipp_cluster.connect_client_sync()
    yield cluster2, other
    other.close()


def test_a_quiet_cluster_has_no_foreign_tasks(shared):
    ours, _ = shared
    found = observe(ours)
    assert found.foreign_tasks == {0: 0, 1: 0}
    assert set(found.host_busy) == {ours.run(__import__("socket").gethostname)[0]}


@interactive
def _wait_for(path, timeout):
    """Another user's task: busy until ``path`` exists (or ``timeout`` s)."""
    import os
    import time
    end = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.01)


def test_another_clients_task_is_found_without_waiting_for_it(shared, tmp_path):
    ours, other = shared
    task = other[ours.engine_ids[1]].apply_async(_wait_for, str(tmp_path / "go"), 10)
    time.sleep(0.3)
    start = time.monotonic()
    found = observe(ours)
    assert time.monotonic() - start < 4  # not queued behind the task (it waits for us)
    assert found.foreign_tasks[1] >= 1 and found.foreign_tasks[0] == 0
    assert found.disturbed and "task(s) of other users queued on rank(s) 1" in found.message()
    (tmp_path / "go").touch()
    task.get(timeout=30)


def spin(stop, seconds):
    end = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < end:
        pass


def test_processes_spinning_on_the_host_are_found(shared):
    ours, _ = shared
    stop = multiprocessing.Event()
    hogs = [multiprocessing.Process(target=spin, args=(stop, 10.0)) for _ in range(
        multiprocessing.cpu_count())]
    for hog in hogs:
        hog.start()
    try:
        time.sleep(0.5)
        found = observe(ours, window=0.5)
    finally:
        stop.set()
        for hog in hogs:
            hog.join(10)
    assert max(found.host_busy.values()) > BUSY_THRESHOLD
    assert found.disturbed and "busy without us" in found.message()


def test_the_message_is_empty_only_when_nothing_disturbs():
    assert Contention({0: 0}, {"h": 0.1}).message() == ""
    assert "host h 90% busy" in Contention({0: 0}, {"h": 0.9}).message()


class Quick(Panel):
    def __init__(self, c):
        super().__init__([widgets.IntSlider(1)], cluster=c)

    def compute(self):
        return self.cluster.run(sum, [1, 2])

    def show(self, result):
        self.say(f"sums {result}")


def test_the_panel_notice_shows_disturbed_timings_and_clears(shared, tmp_path):
    ours, other = shared
    panel = Quick(ours)
    assert panel.run() == [3, 3] and "task(s) of other users" not in panel.notice.value
    blocker = other[ours.engine_ids[0]].apply_async(_wait_for, str(tmp_path / "go"), 10)
    time.sleep(0.3)
    panel.check_contention()  # what run() does after it shows a result
    assert "task(s) of other users queued on rank(s) 0" in panel.notice.value
    (tmp_path / "go").touch()
    blocker.get(timeout=30)
    panel.check_contention()
    assert "task(s) of other users" not in panel.notice.value
