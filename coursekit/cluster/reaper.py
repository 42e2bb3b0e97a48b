"""A watchdog that ends every process of a cluster when the process that started it dies,
even by SIGKILL: the controller, the engines and whatever the engines start, at any time.

ipyparallel stops a cluster when its owner exits normally (an atexit handler: JupyterLab's
"Shut Down Kernel", ``exit()``), but a kernel killed with SIGKILL (nbval's shutdown, the
out-of-memory killer, ``kill -9``) runs no handler, and its controller and engines would run
on, as would every process a lesson started on an engine. :func:`coursekit.cluster.start`
therefore starts one reaper per cluster *before* the cluster::

    python -m coursekit.cluster.reaper OWNER_PID

and the reaper, not the owner, starts the controller and the engines
(:mod:`coursekit.cluster.launchers` sends it each command line on its stdin, one JSON object per
line, and it answers with the PID on its stdout), so every cluster process is a descendant
of the reaper. The reaper serves until OWNER is gone (checked every ``POLL_S`` seconds),
asks it to stop (:meth:`Reaper.close`, called by ``CourseCluster.stop``), closes its stdin
(OWNER's death does) or sends it SIGTERM. Then it ends all its descendants (SIGTERM, SIGKILL
after a grace; psutil refuses to signal a PID that was reused since), again for any that
appeared meanwhile, and exits. It also exits, ending nothing, once every process it started
has ended and left none behind for ``IDLE_EXIT_S`` seconds (a cluster stopped without closing
its reaper). It runs in its own session, so a Ctrl-C or SIGINT to the owner's process group
does not reach it.

What holds on Linux. The reaper makes itself a *child subreaper*
(``prctl(PR_SET_CHILD_SUBREAPER)``, Linux 3.4+, no privilege needed): a process whose parent
exits is adopted by its nearest subreaper ancestor, the reaper, instead of init. So a process
an engine starts stays the reaper's descendant whatever it does (a double fork, ``setsid``,
a new process group, its engine or the kernel dying first), and the reaper's final scan of
its descendants finds it. What escapes: a process that another program starts on request (a
systemd unit, ``at``, a container daemon), and everything if the reaper itself is SIGKILLed.
The reaper also collects the exit status of every child, adopted ones included (no zombies).

Why not something else: a process group or session per cluster is left by any grandchild
that calls ``setsid`` (ipyparallel's engine nanny already does); ``PR_SET_PDEATHSIG`` reaches
only a direct child; a cgroup needs a delegated subtree, which a student's laptop or a
container often lacks; a reaper that only re-scans the owner's descendants misses a daemon
that double-forks between two scans (init adopts it).

macOS has no subreaper: an orphan goes to launchd. There the reaper falls back to scanning its
descendants every ``POLL_S`` seconds and remembering them (psutil handles, safe against PID
reuse), and at the end ends the remembered ones and its current descendants. That covers
every process whose chain of parents up to the reaper is intact at the end (the engines are
alive then: the reaper ends them itself), and every process that lived through one scan while
it was a descendant; a process that detaches (a double fork) less than ``POLL_S`` after it
was started escapes.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

import psutil

from coursekit.cluster.processes import alive, end_processes

__all__ = ["IDLE_EXIT_S", "POLL_S", "Reaper", "ReaperError", "become_subreaper", "serve",
           "start_reaper"]

POLL_S = 0.5
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
REPLY_TIMEOUT_S = 30.0
STOP = b"stop"  # the request of Reaper.close
IDLE_EXIT_S = 2.0  # with nothing left to watch and no request: the cluster was stopped
END_ROUNDS = 10  # rounds of ending descendants: a process ended may leave children of its own


class ReaperError(RuntimeError):
    """The reaper could not start a process or did not answer."""


class Reaper:
    """The owner's side: starts processes through the reaper (see the module's doc).

    ``spawn`` starts a process as the reaper's child; ``close`` ends what is left of the
    reaper's descendants and waits until the reaper has exited.
    """

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "coursekit.cluster.reaper", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True)  # a Ctrl-C or SIGINT to the owner's group does not reach it
        self._lock = threading.Lock()  # one request at a time, whichever thread launches

    @property
    def pid(self) -> int:
        return self.process.pid

    def spawn(self, args: list[str], *, env: dict[str, str], cwd: str, output_file: str) -> int:
        """Start ``args`` as the reaper's child (in a new session, stdin from /dev/null,
        stdout and stderr appended to ``output_file``); return its PID."""
        request = {"args": list(map(str, args)), "env": env, "cwd": cwd, "output": output_file}
        with self._lock:
            try:
                self.process.stdin.write(json.dumps(request).encode() + b"\n")
                self.process.stdin.flush()
            except (BrokenPipeError, ValueError):  # ValueError: closed here already
                raise ReaperError(
                    f"the reaper (pid {self.pid}) has exited; cannot start {args[0]}") from None
            ready, _, _ = select.select([self.process.stdout], [], [], REPLY_TIMEOUT_S)
            line = self.process.stdout.readline() if ready else b""
        if not line:
            try:  # an end of file: it has exited or is exiting
                code = self.process.wait(5 if ready else 0)
                why = f"exited with code {code}"
            except subprocess.TimeoutExpired:
                why = f"did not answer within {REPLY_TIMEOUT_S} s"
            raise ReaperError(f"the reaper (pid {self.pid}) {why} when asked to start {args[0]}")
        reply = json.loads(line)
        if "error" in reply:
            raise ReaperError(f"the reaper could not start {args}: {reply['error']}")
        return reply["pid"]

    def close(self, timeout: float = 15.0) -> None:
        """Tell the reaper that the cluster was stopped: it ends whatever is left of its
        descendants and exits. Waits up to ``timeout`` s, then kills it (a last resort:
        what it had not ended yet is then adopted by init)."""
        # a request, not only an end of file: a process this one forked (a multiprocessing
        # worker) holds a copy of the pipe, and the reaper sees no end of file while it lives
        with self._lock:
            stdin = self.process.stdin
            try:
                if not stdin.closed:
                    stdin.write(STOP + b"\n")
                    stdin.flush()
            except BrokenPipeError:  # it has exited already
                pass
            finally:
                try:
                    stdin.close()
                except BrokenPipeError:
                    pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


def start_reaper() -> Reaper:
    """Start the reaper of this process (the owner of the cluster it will start)."""
    return Reaper()


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux); False where that is not
    possible (macOS, Windows, a kernel older than 3.4)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap_zombies(*_signal_args) -> bool:
    """Collect the exit status of every ended child (also the SIGCHLD handler: ipyparallel's
    launchers wait for a cluster process by polling its PID, which a zombie still holds);
    return whether any child is left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _spawn(line: bytes) -> dict:
    """Start the process a request line asks for; the reply for the owner."""
    try:
        request = json.loads(line)
        with open(request["output"], "ab") as output:
            child = subprocess.Popen(
                request["args"], stdin=subprocess.DEVNULL, stdout=output,
                stderr=subprocess.STDOUT, env=request["env"], cwd=request["cwd"],
                start_new_session=True)  # like ipyparallel: signals to the reaper stay with it
        return {"pid": child.pid}
    except (OSError, KeyError, TypeError, ValueError) as error:  # ValueError: not JSON
        return {"error": f"{type(error).__name__}: {error}"}


class _Requests:
    """Lines from a file descriptor, read without blocking past ``select``."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buffer = b""
        self.closed = False

    def lines(self, timeout: float) -> list[bytes]:
        """The complete lines that arrive within ``timeout`` s (sets ``closed`` at EOF)."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            chunk = os.read(self.fd, 1 << 16)
            self.closed = not chunk
            self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return lines


def end_descendants(remembered: dict | None = None) -> list[psutil.Process]:
    """End this process's descendants and the ``remembered`` ones, round after round until
    none is left (a process ended may leave children, adopted by a subreaper); return them."""
    me = psutil.Process()
    ended: list[psutil.Process] = []
    for _ in range(END_ROUNDS):
        left = [p for p in {*me.children(recursive=True), *(remembered or {}).values()}
                if alive(p)]
        if not left:
            break
        end_processes(left)
        ended += left
    return ended


def serve(owner_pid: int, requests_fd: int = 0, replies_fd: int = 1,
          poll_s: float = POLL_S) -> list[psutil.Process]:
    """The reaper's loop: start the processes the owner asks for until the owner is gone,
    sends ``STOP``, closes ``requests_fd`` or this process gets SIGTERM; then end every
    descendant and return what was ended. Also returns, ending nothing, once every process
    it started has ended and left none behind, and no request came, for ``IDLE_EXIT_S``
    seconds (the cluster was stopped without closing the reaper)."""
    subreaper = become_subreaper()
    signal.signal(signal.SIGCHLD, _reap_zombies)
    signal.signal(signal.SIGTERM, _stop_serving)
    remembered: dict[int, psutil.Process] = {}  # without a subreaper: every descendant seen
    try:
        owner = psutil.Process(owner_pid)
        requests = _Requests(requests_fd)
        started, busy_at = False, time.monotonic()
        while alive(owner) and not requests.closed:
            for line in requests.lines(poll_s):
                if line == STOP:
                    raise _StopServing
                reply = _spawn(line)
                started, busy_at = started or "pid" in reply, time.monotonic()
                os.write(replies_fd, json.dumps(reply).encode() + b"\n")
            if not subreaper:
                remembered.update((p.pid, p) for p in psutil.Process().children(recursive=True))
            if _reap_zombies() or any(map(alive, remembered.values())):
                busy_at = time.monotonic()  # (a subreaper with no child has no descendant)
            elif started and time.monotonic() - busy_at >= IDLE_EXIT_S:
                break
    except (psutil.NoSuchProcess, OSError, _StopServing):  # OSError: the owner's pipes are gone
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # nothing interrupts the ending
    return end_descendants(remembered)


class _StopServing(Exception):
    """Raised by the SIGTERM handler: end the cluster now."""


def _stop_serving(*_signal_args) -> None:
    raise _StopServing


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m coursekit.cluster.reaper OWNER_PID  (requests on stdin, one JSON "
              "object per line; see coursekit.cluster.reaper)", file=sys.stderr)
        return 2
    serve(int(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
