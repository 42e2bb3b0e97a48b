"""Fixtures and marker rules shared by every test under tests/ (the repository's
conftest.py sets up the run itself: IPYTHONDIR, ``last`` ordering, the final clean-up).

Clusters. ``cluster2``, ``cluster3`` and ``cluster4`` are healthy local clusters of 2, 3
and 4 engines, each started once per run and shared by every test that asks for it; each
is stopped right after the last test that uses it (so no shared engine is alive while
the notebooks or the ``last`` leak checks run). A test that uses one must leave it as it
found it: no killed engine, no interrupt, no stop (``cluster.connect`` to it and
``stop()`` that handle to play a notebook attached to it). A test that breaks its
cluster, or needs another shape, asks for ``start_cluster`` instead: its clusters are its
own and are stopped when it ends.

Markers. A test that uses one of these fixtures is marked ``cluster`` here. A test that
is not marked ``cluster`` and starts one anyway (an ipyparallel controller, through
``coursekit.cluster.start`` or not, or any process running an ipyparallel controller or
engine) fails with an error saying so, as does one not marked ``mpi`` that runs
``mpiexec`` and one not marked ``ui`` that starts JupyterLab (or ``make lab``), Chromium
or Playwright's driver: ``make test-fast`` (``-m "not cluster and not mpi and not ui and
not slow"``) can trust the markers. Only processes this pytest process spawns are
checked; a kernel or script it starts that starts a cluster itself must be marked by
hand (tests/test_release.py, tests/test_reaper.py, tests/test_notebooks.py do).
"""

from __future__ import annotations

import os
import subprocess

import ipyparallel
import numpy as np
import pytest

from coursekit import cluster as course_cluster

SHARED_CLUSTERS = {"cluster2": 2, "cluster3": 3, "cluster4": 4}
CLUSTER_FIXTURES = {*SHARED_CLUSTERS, "start_cluster"}

# what a spawned command line must not contain unless the test has the marker
GUARDED = {
    "cluster": ("ipyparallel.controller", "ipyparallel.engine", "ipyparallel.cluster",
                "ipcontroller", "ipengine", "ipcluster"),
    "mpi": ("mpiexec", "mpirun"),
    "ui": ("jupyter-lab", "jupyterlab", "jupyter lab", "make lab", "chromium", "playwright"),
}

_shared: dict[str, course_cluster.CourseCluster] = {}
_last_user: dict[str, str] = {}  # shared fixture -> node id of the last test using it


# -- markers --------------------------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)


@pytest.hookimpl(trylast=True)  # the final order: after -m, -k and the `last` sort
def pytest_collection_finish(session):
    _last_user.clear()
    for item in session.items:
        for name in SHARED_CLUSTERS.keys() & set(getattr(item, "fixturenames", ())):
            _last_user[name] = item.nodeid


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item, nextitem):
    for name, nodeid in _last_user.items():
        if nodeid == item.nodeid and name in _shared:
            _shared.pop(name).stop()


class MarkerGuard:
    """What the running test may start; what it tried to start without the marker."""

    def __init__(self, markers: set[str]):
        self.markers = markers
        self.violations: list[str] = []

    def refuse(self, marker: str, what: str) -> None:
        message = (f"this test is not marked {marker!r} but {what}: mark it "
                   f"@pytest.mark.{marker} (or use the cluster fixtures of tests/conftest.py, "
                   f"which mark it)")
        self.violations.append(message)
        raise RuntimeError(message)

    def check_command(self, args) -> None:
        line = args if isinstance(args, (str, bytes)) else " ".join(map(str, args))
        line = os.fsdecode(line) if isinstance(line, bytes) else line
        for marker, needles in GUARDED.items():
            if marker not in self.markers:
                for needle in needles:
                    if needle in line:
                        self.refuse(marker, f"it started {line[:200]!r}")


@pytest.fixture(autouse=True)
def cluster_guard(request):
    """Refuse (and fail the test for) starting a cluster, MPI or the UI without the marker.
    The guard's own test (tests/test_markers.py) reads and clears ``violations``."""
    guard = MarkerGuard({m.name for m in request.node.iter_markers()})
    monkeypatch = pytest.MonkeyPatch()  # its own: the test's monkeypatch stays the test's
    if "cluster" not in guard.markers:  # (coursekit.cluster.start may still check arguments)
        async def start_controller(*args, **kwargs):
            guard.refuse("cluster", "it started an ipyparallel controller")
        monkeypatch.setattr(ipyparallel.Cluster, "start_controller", start_controller)
    execute_child = subprocess.Popen._execute_child

    def guarded_execute_child(self, args, *rest, **kwargs):
        guard.check_command(args)
        return execute_child(self, args, *rest, **kwargs)

    if {"cluster", "mpi", "ui"} - guard.markers:
        monkeypatch.setattr(subprocess.Popen, "_execute_child", guarded_execute_child)
    yield guard
    monkeypatch.undo()
    if guard.violations:
        pytest.fail("\n".join(guard.violations), pytrace=False)


# -- clusters -------------------------------------------------------------------------------
def _shared_cluster(name: str):
    if name not in _shared:
        _shared[name] = course_cluster.start(n=SHARED_CLUSTERS[name])
    return _shared[name]


@pytest.fixture(scope="session")
def cluster2():
    """A healthy local cluster of 2 engines shared by the run (see the module's doc)."""
    yield _shared_cluster("cluster2")
    if "cluster2" in _shared:
        _shared.pop("cluster2").stop()


@pytest.fixture(scope="session")
def cluster3():
    """A healthy local cluster of 3 engines shared by the run (see the module's doc)."""
    yield _shared_cluster("cluster3")
    if "cluster3" in _shared:
        _shared.pop("cluster3").stop()


@pytest.fixture(scope="session")
def cluster4():
    """A healthy local cluster of 4 engines shared by the run (see the module's doc)."""
    yield _shared_cluster("cluster4")
    if "cluster4" in _shared:
        _shared.pop("cluster4").stop()


@pytest.fixture
def start_cluster():
    """``start_cluster(n, **kwargs)``: ``coursekit.cluster.start`` for this test alone; every
    cluster it started is stopped when the test ends (stopping twice is harmless)."""
    started = []

    def start(*args, **kwargs):
        c = course_cluster.start(*args, **kwargs)
        started.append(c)
        return c

    yield start
    for c in started:
        c.stop()


# -- data -----------------------------------------------------------------------------------
def _read_only(dataset):
    for array in (dataset.X_train, dataset.y_train, dataset.X_test, dataset.y_test):
        array.flags.writeable = False  # shared by many tests: none may change it
    return dataset


@pytest.fixture(scope="session")
def digits_f64():
    """scikit-learn's digits, float64, the course's split (coursekit.data.load_digits)."""
    from coursekit.data import load_digits

    return _read_only(load_digits(dtype=np.float64))


@pytest.fixture(scope="session")
def digits_f32():
    """scikit-learn's digits, float32 (load_digits' default), the course's split."""
    from coursekit.data import load_digits

    return _read_only(load_digits())
