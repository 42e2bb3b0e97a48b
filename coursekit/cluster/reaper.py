"""A watchdog that ends a cluster when the process that started it dies, even by SIGKILL.

ipyparallel stops a cluster when its owner exits normally (an atexit handler: JupyterLab's
"Shut Down Kernel", ``exit()``), but a kernel killed with SIGKILL (nbval's shutdown,
the out-of-memory killer, ``kill -9``) runs no handler, and its controller and engines
would run on. :func:`coursekit.cluster.start` therefore launches one reaper per cluster::

    python -m coursekit.cluster.reaper OWNER_PID PID [PID ...]

It checks every ``POLL_S`` seconds whether OWNER is still alive; when it is gone, the
reaper ends the cluster's processes (PIDs and their descendants, as they were when the
reaper started: psutil refuses to signal a PID that was reused since) and exits. It also
exits, ending nothing, once every watched process has ended (the cluster was stopped).
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from coursekit.cluster.processes import alive, end_processes, with_descendants

__all__ = ["POLL_S", "start_reaper", "watch"]

POLL_S = 0.5


def start_reaper(pids: list[int]) -> subprocess.Popen:
    """Launch the reaper for this process and the cluster processes ``pids``."""
    return subprocess.Popen(
        [sys.executable, "-m", "coursekit.cluster.reaper", str(psutil.Process().pid), *map(str, pids)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)  # a Ctrl-C or SIGINT to the owner's group does not reach it


def watch(owner_pid: int, pids: list[int], poll_s: float = POLL_S) -> list[psutil.Process]:
    """Wait until the owner dies (then end ``pids`` and their descendants) or every
    watched process has ended; return the processes it ended."""
    try:
        owner = psutil.Process(owner_pid)
    except psutil.NoSuchProcess:
        owner = None
    watched = with_descendants(pids)
    while owner is not None and alive(owner) and any(alive(p) for p in watched):
        time.sleep(poll_s)
    left = [p for p in watched if alive(p)]
    end_processes(left)
    return left


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or not all(a.isdigit() for a in args):
        print("usage: python -m coursekit.cluster.reaper OWNER_PID PID [PID ...]", file=sys.stderr)
        return 2
    watch(int(args[0]), [int(a) for a in args[1:]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
