"""end_processes: a process that ignores SIGTERM is killed after the grace; a zombie has
ended and is not waited for (an orphaned one waits for init, which can take seconds)."""

import subprocess
import sys
import time

import psutil

from coursekit.cluster.processes import alive, end_processes

IGNORES_SIGTERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""

NEVER_REAPS = """
import subprocess, time
child = subprocess.Popen(["sleep", "60"])  # never waited for: once it ends it stays a zombie
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace():
    stubborn = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout.readline().strip() == "ready"
        started = time.monotonic()
        process = psutil.Process(stubborn.pid)
        end_processes([process], grace=0.5)
        assert 0.5 <= time.monotonic() - started < 5  # SIGTERM did nothing for the grace
        assert not alive(process) and not psutil.pid_exists(stubborn.pid)  # killed and reaped
    finally:
        stubborn.kill()
        stubborn.wait()


def test_a_zombie_has_ended_and_is_not_waited_for():
    parent = subprocess.Popen([sys.executable, "-c", NEVER_REAPS], stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        started = time.monotonic()
        end_processes([child], grace=5)
        assert time.monotonic() - started < 2.5  # not the 5 s grace: SIGTERM ended it at once
        assert child.status() == psutil.STATUS_ZOMBIE and not alive(child)  # its parent never reaps it
    finally:
        parent.kill()
        parent.wait()
