"""Runs last: nothing the tests or notebooks started may still be running."""

import pytest

from coursekit.processes import cluster_processes, describe, end_cluster_processes


@pytest.mark.last
def test_no_cluster_process_survives_the_run(ipython_dir):
    survivors = [describe(p) for p in cluster_processes(ipython_dir)]
    end_cluster_processes(ipython_dir)  # do not leave them to the next run either
    assert survivors == [], "processes left behind:\n" + "\n".join(survivors)


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
