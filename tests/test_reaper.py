"""A cluster whose owner dies without stopping it (a kernel killed by SIGKILL) is ended by
its reaper; a cluster stopped normally leaves no reaper behind."""

import os
import subprocess
import sys
import time

import psutil
import pytest

from coursekit.cluster.processes import cluster_processes, describe, end_cluster_processes
from coursekit.cluster.reaper import POLL_S, main as reaper_main

OWNER = """
import os, sys, time
from coursekit import cluster
c = cluster.start(n=2)
print(c._reaper.pid, flush=True)
time.sleep(600)
"""


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.cluster  # started by a subprocess: the guard of tests/conftest.py cannot see it
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_killed_owner_leaves_no_cluster_behind(tmp_path, how):
    env = dict(os.environ, IPYTHONDIR=str(tmp_path))
    owner = subprocess.Popen([sys.executable, "-c", OWNER], env=env, stdout=subprocess.PIPE,
                             text=True)
    try:
        reaper = psutil.Process(int(owner.stdout.readline()))
        running = cluster_processes(str(tmp_path))
        assert len(running) >= 3, [describe(p) for p in running]  # controller + 2 engines
        (owner.kill if how == "SIGKILL" else owner.terminate)()
        owner.wait(10)
        gone = wait_until(lambda: not cluster_processes(str(tmp_path)), timeout=10 + 2 * POLL_S)
        assert gone, [describe(p) for p in cluster_processes(str(tmp_path))]
        assert wait_until(lambda: not reaper.is_running(), timeout=5)
    finally:
        owner.kill()
        end_cluster_processes(str(tmp_path))


@pytest.mark.cluster
def test_a_stopped_cluster_ends_its_reaper(tmp_path, monkeypatch):
    from coursekit import cluster

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path))
    c = cluster.start(n=1)
    reaper = psutil.Process(c._reaper.pid)
    assert "coursekit.cluster.reaper" in " ".join(reaper.cmdline())
    c.stop()
    assert not reaper.is_running() and cluster_processes(str(tmp_path)) == []


def test_the_reaper_refuses_bad_arguments(capsys):
    assert reaper_main(["12"]) == 2 and reaper_main(["x", "1"]) == 2
    assert "usage: python -m coursekit.cluster.reaper OWNER_PID PID" in capsys.readouterr().err
