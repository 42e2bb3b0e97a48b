"""A cluster whose owner dies without stopping it (a kernel killed by SIGKILL) is ended by
its reaper; a cluster stopped normally leaves no reaper behind."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from ipyparallel import interactive  # ship the engine functions by value

from coursekit.cluster.processes import (alive, cluster_processes, describe, end_cluster_processes,
                                 end_processes)
from coursekit.cluster.reaper import IDLE_EXIT_S, POLL_S, Reaper, ReaperError, main as reaper_main

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
    # (never a valid OWNER_PID here: the reaper would serve, then end this process's children)
    assert reaper_main([]) == 2 and reaper_main(["x"]) == 2 and reaper_main(["12", "13"]) == 2
    assert "usage: python -m coursekit.cluster.reaper OWNER_PID" in capsys.readouterr().err


# -- processes the engines start --------------------------------------------------------------
@interactive
def start_children(kind, record):
    """Runs on an engine: start ``sleep 600`` processes the engine never ends, and append
    ``PID CREATE_TIME`` of each to the file ``record``. ``plain``: a child, now; ``later``: a
    thread of the engine starts one every 0.2 s from 0.5 s on, until the engine ends (the last
    ones after its kernel was killed); ``detached``: a grandchild in its own session, whose
    parent exits at once (a daemon's double fork), so the engine is not its ancestor."""
    import subprocess
    import sys
    import threading
    import time

    import psutil

    detach = ("import subprocess as s; print(s.Popen(['sleep', '600'], start_new_session=True, "
              "stdin=s.DEVNULL, stdout=s.DEVNULL, stderr=s.DEVNULL).pid)")

    def note(pid):
        with open(record, "a") as out:
            out.write(f"{pid} {psutil.Process(pid).create_time()}\n")

    if kind == "plain":
        note(subprocess.Popen(["sleep", "600"]).pid)
    elif kind == "detached":
        out = subprocess.run([sys.executable, "-c", detach], capture_output=True, text=True,
                             check=True)
        note(int(out.stdout))
    else:
        def keep_starting():
            time.sleep(0.5)
            for _ in range(100):
                note(subprocess.Popen(["sleep", "600"]).pid)
                time.sleep(0.2)

        threading.Thread(target=keep_starting, daemon=True).start()


def recorded(record) -> list[psutil.Process]:
    """The processes ``record`` names that are still the ones it named (not a reused PID)."""
    found = []
    lines = record.read_text().split("\n") if record.exists() else []
    for line in lines:
        if line.count(" ") != 1:  # an incomplete last line
            continue
        pid, create_time = line.split()
        try:
            process = psutil.Process(int(pid))
            if process.create_time() == float(create_time):
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


KERNEL = """
import subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from coursekit import cluster
from test_reaper import start_children
c = cluster.start(n=2)
c.run(start_children, sys.argv[2], sys.argv[3])
print(subprocess.Popen(["sleep", "600"]).pid, flush=True)  # the kernel's own child
time.sleep(600)
"""


@pytest.mark.cluster  # started by a subprocess: the guard of tests/conftest.py cannot see it
@pytest.mark.parametrize("kind", ["plain", "later", "detached"])
def test_a_killed_kernel_ends_every_process_its_engines_started(tmp_path, kind):
    """Issue 29: the engines' children outlived a SIGKILLed kernel; the reaper ended only the
    processes that existed when it started. Nothing that is not the cluster's is ended."""
    env = dict(os.environ, IPYTHONDIR=str(tmp_path / "ipython"))
    record = tmp_path / "children"
    bystander = subprocess.Popen(["sleep", "600"], env=env)  # same IPYTHONDIR, not the cluster's
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL, os.path.dirname(__file__), kind, str(record)],
        env=env, stdout=subprocess.PIPE, text=True)
    kernels_child = None
    try:
        kernels_child = psutil.Process(int(kernel.stdout.readline()))
        assert wait_until(lambda: len(recorded(record)) >= 2, timeout=10)  # 1+ per engine
        kernel.kill()
        kernel.wait(10)
        assert wait_until(lambda: not recorded(record), timeout=10), [
            describe(p) for p in recorded(record)]
        assert alive(kernels_child) and alive(psutil.Process(bystander.pid))
    finally:
        kernel.kill()
        end_cluster_processes(env["IPYTHONDIR"])  # first the engines, which may start more
        end_processes([*recorded(record), *filter(None, [kernels_child])], grace=1)
        bystander.kill()
        bystander.wait()


def test_a_stopped_cluster_ends_every_process_its_engines_started(start_cluster, tmp_path):
    """stop() ended the engines' children that it saw when it began, not a detached one nor
    one started meanwhile; now the reaper ends what is left of its descendants."""
    c = start_cluster(2)
    record = tmp_path / "children"
    for kind in ("plain", "detached", "later"):
        c.run(start_children, kind, str(record))
    assert wait_until(lambda: len(recorded(record)) >= 8, timeout=10)
    try:
        c.stop()
        assert wait_until(lambda: not recorded(record), timeout=5), [
            describe(p) for p in recorded(record)]
    finally:
        end_processes(recorded(record), grace=1)


# -- the reaper alone ---------------------------------------------------------------------------
DAEMON = """
import os, time
if os.fork():
    os._exit(0)  # the reaper's child exits at once ...
os.setsid()
if os.fork():
    os._exit(0)  # ... and the daemon, in its own session, is nobody's child any more
print(os.getpid(), flush=True)
time.sleep(600)
"""

OWNER_OF_A_DAEMON = """
import os, subprocess, sys, time
from coursekit.cluster.reaper import Reaper
reaper = Reaper()
reaper.spawn([sys.executable, "-c", sys.argv[1]], env=dict(os.environ), cwd=os.getcwd(),
             output_file=sys.argv[2])
print(reaper.pid, subprocess.Popen(["sleep", "600"]).pid, flush=True)  # + its own child
time.sleep(600)
"""


@pytest.mark.slow  # processes killed
def test_a_daemon_started_through_the_reaper_ends_with_the_owner(tmp_path):
    """A classic double-forked daemon is still the reaper's descendant (a subreaper adopts
    it), so it ends when the owner is SIGKILLed; the owner's own child is left alone."""
    output = tmp_path / "daemon.out"
    owner = subprocess.Popen([sys.executable, "-c", OWNER_OF_A_DAEMON, DAEMON, str(output)],
                             stdout=subprocess.PIPE, text=True)
    processes = []
    try:
        reaper, owners_child = (psutil.Process(int(pid)) for pid in owner.stdout.readline().split())
        processes += [reaper, owners_child]
        assert wait_until(lambda: output.exists() and output.read_text().endswith("\n"), 10)
        daemon = psutil.Process(int(output.read_text()))
        processes.append(daemon)
        assert daemon.ppid() == reaper.pid  # adopted by the reaper, not by init
        owner.kill()
        owner.wait(10)
        assert wait_until(lambda: not alive(daemon) and not alive(reaper), timeout=5 + 2 * POLL_S)
        assert alive(owners_child)
    finally:
        owner.kill()
        owner.wait()
        end_processes(processes, grace=1)


@pytest.mark.slow  # a command run in its own process
def test_a_reaper_whose_processes_all_ended_exits_and_says_so(tmp_path):
    """Its cluster was stopped without closing it (ipyparallel's own stop, a clean-up that ended
    the processes): it exits, ending nothing, and a later request names that it has exited."""
    reaper = Reaper()
    try:
        with pytest.raises(ReaperError, match="could not start.*FileNotFoundError"):
            reaper.spawn([str(tmp_path / "missing")], env=dict(os.environ), cwd=str(tmp_path),
                         output_file=str(tmp_path / "out"))
        assert reaper.process.poll() is None  # a failed start is not an end
        reaper.spawn(["sleep", "0.2"], env=dict(os.environ), cwd=str(tmp_path),
                     output_file=str(tmp_path / "out"))
        assert reaper.process.wait(IDLE_EXIT_S + 5 + 2 * POLL_S) == 0
        with pytest.raises(ReaperError, match="has exited|exited with code 0"):
            reaper.spawn(["sleep", "1"], env=dict(os.environ), cwd=str(tmp_path),
                         output_file=str(tmp_path / "out"))
    finally:
        reaper.close()


@pytest.mark.slow  # a command run in its own process
def test_close_does_not_wait_for_a_fork_of_the_owner(tmp_path):
    """A process the owner forked (a multiprocessing worker, forked by default on Linux)
    holds a copy of the reaper's stdin, so closing it is no end of file: close() asks."""
    reaper = Reaper()
    child = psutil.Process(reaper.spawn(["sleep", "600"], env=dict(os.environ),
                                        cwd=str(tmp_path), output_file=str(tmp_path / "out")))
    fork = os.fork()
    if fork == 0:  # the fork only holds the owner's files open
        time.sleep(30)
        os._exit(0)
    try:
        started = time.monotonic()
        reaper.close(timeout=10)
        assert reaper.process.returncode == 0 and time.monotonic() - started < 5
        assert wait_until(lambda: not alive(child), timeout=5)
    finally:
        os.kill(fork, signal.SIGKILL)
        os.waitpid(fork, 0)
        end_processes([child], grace=1)
