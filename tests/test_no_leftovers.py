"""Runs last: nothing the tests or notebooks started may still be running."""

import os
import tempfile
import time
from pathlib import Path

import pytest

from coursekit.cluster.processes import cluster_processes, describe, end_cluster_processes


@pytest.mark.last
def test_no_cluster_process_survives_the_run(ipython_dir):
    survivors = [describe(p) for p in cluster_processes(ipython_dir)]
    end_cluster_processes(ipython_dir)  # do not leave them to the next run either
    assert survivors == [], "processes left behind:\n" + "\n".join(survivors)


@pytest.mark.last
def test_no_scratch_folder_of_this_run_survives(ipython_dir):
    """Chapters 3 and 4 write to coursekit.cluster.scratch folders; each goes with its kernel."""
    started = os.stat(ipython_dir).st_ctime  # made when the run began (conftest.py)
    deadline = time.monotonic() + 5.0  # the watchers poll every 0.5 s

    def made_in_this_run(path: Path) -> bool:
        try:
            return path.stat().st_ctime >= started
        except FileNotFoundError:  # removed just now
            return False

    def left():
        return [p for p in Path(tempfile.gettempdir()).glob("coursekit-ch0*") if made_in_this_run(p)]

    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left() == [], "scratch folders left behind"


@pytest.mark.cluster
def test_the_leak_check_sees_a_leaked_cluster(tmp_path, monkeypatch):
    """The check above must be able to fail: a cluster nobody stops is found, then ended."""
    from coursekit import cluster

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path))  # its own dir: other clusters are not touched
    leaked = cluster.start(n=1)
    found = [describe(p) for p in cluster_processes(str(tmp_path))]
    assert any("ipyparallel.controller" in line for line in found), found
    assert any("ipyparallel.engine" in line for line in found), found
    leaked.client.close()
    assert len(end_cluster_processes(str(tmp_path))) == len(found)
    assert cluster_processes(str(tmp_path)) == []
