"""Find and end the processes a cluster leaves behind (controllers, engines, MPI).

nbval kills a notebook's kernel without running its atexit handlers, so a
cluster that a notebook did not stop would outlive it. The test run and the
notebook builder therefore give kernels their own ``IPYTHONDIR`` and, at the
end, end every cluster process that inherited it.
"""

from __future__ import annotations

import re
import time

import psutil

CLUSTER_COMMAND = re.compile(
    r"ipyparallel\.(controller|engine)|ipcontroller|ipengine|ipcluster|mpiexec|hydra_pmi_proxy"
)


def cluster_processes(ipython_dir: str | None = None) -> list[psutil.Process]:
    """Cluster processes; only those started under ``ipython_dir`` if it is given."""
    return _processes(ipython_dir, CLUSTER_COMMAND)


def ipython_dir_processes(ipython_dir: str) -> list[psutil.Process]:
    """Every process started under ``ipython_dir``, whatever it runs: a kernel, its
    clusters, and anything a notebook spawned (children inherit the environment)."""
    return _processes(ipython_dir, None)


def _processes(ipython_dir: str | None, command: re.Pattern | None) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        if command is not None and not command.search(" ".join(proc.info["cmdline"] or [])):
            continue
        environ = proc.info["environ"] or {}
        if ipython_dir is None or environ.get("IPYTHONDIR") == str(ipython_dir):
            found.append(proc)
    return found


def alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (a dead child its parent has not reaped yet)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:160]}"
    except psutil.NoSuchProcess:
        return f"pid {proc.pid}: (gone)"


def with_descendants(pids: list[int]) -> list[psutil.Process]:
    """psutil handles of these processes and all their descendants (e.g. engine nannies)."""
    processes = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            processes += [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return processes


def end_processes(processes: list[psutil.Process], grace: float = 3.0) -> None:
    """Terminate the processes still alive, and kill those alive ``grace`` s later."""
    for proc in processes:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    left = _wait_until_ended(processes, grace)
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    _wait_until_ended(left, grace)


def _wait_until_ended(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until none of ``processes`` is ``alive``; return those still alive at ``timeout``.

    A zombie has ended: an orphan's one (an engine's nanny, once its engine has exited)
    waits for init to reap it, which can take seconds. Our own children are reaped here.
    """
    deadline = time.monotonic() + timeout
    while True:
        _, left = psutil.wait_procs(processes, timeout=0.05)
        processes = [proc for proc in left if alive(proc)]
        if not processes or time.monotonic() >= deadline:
            return processes


def end_cluster_processes(ipython_dir: str | None = None, grace: float = 3.0) -> list[str]:
    """End the cluster processes of ``ipython_dir``; return what was ended."""
    processes = cluster_processes(ipython_dir)
    ended = [describe(proc) for proc in processes]
    end_processes(processes, grace)
    return ended
