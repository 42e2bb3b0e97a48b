"""The marker rules of tests/conftest.py can fail: a test not marked ``cluster`` cannot
start a cluster, one not marked ``mpi`` cannot run mpiexec, one not marked ``ui`` cannot
start JupyterLab."""

import subprocess
import sys

import pytest

from coursekit import cluster


def test_an_unmarked_test_that_starts_a_cluster_is_stopped_and_failed(cluster_guard):
    with pytest.raises(RuntimeError, match="not marked 'cluster' but it started an ipyparallel "
                                           "controller"):
        cluster.start(n=1, timeout=5)
    with pytest.raises(RuntimeError, match="not marked 'cluster' but it started .*"
                                           "ipyparallel.engine"):
        subprocess.run([sys.executable, "-m", "ipyparallel.engine", "--help"], timeout=30)
    assert len(cluster_guard.violations) == 2  # the test fails at teardown, even if caught
    cluster_guard.violations.clear()  # (this one only shows that it would)


def test_an_unmarked_test_that_runs_mpiexec_or_jupyterlab_is_failed(cluster_guard):
    with pytest.raises(RuntimeError, match="not marked 'mpi' but it started 'mpiexec -n 2"):
        subprocess.run(["mpiexec", "-n", "2", "true"], timeout=30)
    with pytest.raises(RuntimeError, match="not marked 'ui' but it started 'jupyter lab"):
        subprocess.Popen("jupyter lab --no-browser", shell=True)
    assert len(cluster_guard.violations) == 2
    cluster_guard.violations.clear()


def test_arguments_are_still_checked_without_a_cluster():
    with pytest.raises(ValueError, match=r"n=0: must be >= 1 \(the number of engines\)"):
        cluster.start(n=0)


def test_other_processes_are_allowed(cluster_guard):
    done = subprocess.run([sys.executable, "-c", "print('fine')"], capture_output=True,
                          text=True, timeout=30)
    assert done.stdout == "fine\n" and cluster_guard.violations == []


@pytest.mark.cluster
def test_a_marked_test_passes_the_guard(cluster_guard):
    assert "cluster" in cluster_guard.markers
    with pytest.raises(ValueError, match="threads_per_engine=0: must be >= 1"):
        cluster.start(n=1, threads_per_engine=0)  # the real start (it refuses before starting)

