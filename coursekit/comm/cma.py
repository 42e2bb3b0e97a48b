"""Single-copy transfers between processes on one Linux host (cross-memory attach).

``process_vm_readv(pid, local, remote)`` copies bytes straight out of another process's
memory into ours: one memcpy done by the kernel, no socket, no intermediate buffer. MPICH
and Open MPI use it for large messages between ranks on one node ("CMA"); ZmqComm uses it
the same way (see :mod:`coursekit.comm.zmq`). Compared with TCP over loopback, which
copies every byte twice (sender -> kernel socket buffer -> receiver) and segments it into
64 KiB packets, it moves a large array at about memcpy speed:
t = alpha_control + n / bw_memcpy instead of alpha + n / bw_tcp.

The kernel allows it only where the reader could ptrace the owner (same user; Yama's
``ptrace_scope`` and container seccomp profiles may forbid it); :func:`read_into` then
raises ``PermissionError`` and callers fall back to sockets. Under Yama's
``ptrace_scope=1`` (Ubuntu's default) a process may read its descendants only, not a
sibling engine. Open MPI lifts that with ``PR_SET_PTRACER_ANY`` (any process of the user
may then read the rank). :func:`allow_readers` grants less: only the nearest common
ancestor of this rank and its same-host peers (the ipcluster, mpiexec or slurmstepd that
started them) and that ancestor's descendants; never the system's init, i.e. never "any
process" (pid 1 of a container's own pid namespace is that container's launcher and may
be the ancestor). The grant is process-wide, so it is kept per holder (each ZmqComm) and
withdrawn when the last one closes (:func:`withdraw_readers`). Not available off Linux.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

import numpy as np


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _bind_libc():
    """(process_vm_readv, prctl) from the C library, or (None, None) off Linux."""
    if not sys.platform.startswith("linux"):
        return None, None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError):
        return None, None
    iov = ctypes.POINTER(_IOVec)
    fn.argtypes = [ctypes.c_int, iov, ctypes.c_ulong, iov, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_ssize_t
    return fn, libc.prctl


_process_vm_readv, _prctl = _bind_libc()


_PR_SET_PTRACER = 0x59616D61  # "Yama"
_grants: dict[object, int] = {}  # holder -> the ancestor it asked for


def process_chain(pid: int) -> list[int]:
    """``pid`` and its ancestors up to init, from /proc ([] if ``pid`` is gone)."""
    chain = []
    while pid > 0 and pid not in chain:
        chain.append(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return [] if len(chain) == 1 else chain
        pid = int(stat[stat.rindex(b")") + 2:].split()[1])  # field 4: ppid
    return chain


_INITIAL_PID_NAMESPACE = 0xEFFFFFFC  # the kernel's PROC_PID_INIT_INO


def common_ancestor(pids) -> int | None:
    """The nearest process that all of ``pids`` descend from (a pid counts as its own
    descendant); None when one is gone or they share only the system's init. Pid 1 of a
    child pid namespace (a container's or ``unshare --pid``'s launcher) is an ancestor
    like any other: it bounds that namespace only."""
    chains = [process_chain(pid) for pid in pids]
    if not chains or not all(chains):
        return None
    shared = set(chains[0]).intersection(*chains[1:])
    ancestor = next((pid for pid in chains[0] if pid in shared), None)
    if ancestor == 1 and _pid_namespace() == _INITIAL_PID_NAMESPACE:
        return None
    return ancestor


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return _INITIAL_PID_NAMESPACE  # unknown: treat pid 1 as the system's init


def allow_readers(holder, peers) -> int | None:
    """Let this process's same-host ``peers`` (pids) read it under Yama ``ptrace_scope=1``.

    ``prctl(PR_SET_PTRACER, a)`` with ``a`` the nearest common ancestor of this process
    and every peer (and of every other holder's grant): ``a`` and its descendants may read
    this process, no one else. Returns ``a``, or None (nothing granted) when the only
    shared ancestor is init. Without Yama (or off Linux) the call changes nothing.
    """
    ancestor = common_ancestor([os.getpid(), *peers])
    if ancestor is None:
        return None
    _grants[holder] = ancestor
    _declare(common_ancestor(set(_grants.values())) or 0)
    return ancestor


def withdraw_readers(holder) -> None:
    """Take back ``holder``'s grant; with no holder left, no process is declared (the
    default: only ancestors may read this one under ``ptrace_scope=1``)."""
    if _grants.pop(holder, None) is not None:
        remaining = set(_grants.values())
        _declare((common_ancestor(remaining) or 0) if remaining else 0)


def declared_reader() -> int:
    """The process this one declared with PR_SET_PTRACER (0: none)."""
    return _declared


_declared = 0


def _declare(pid: int) -> None:
    global _declared
    if _prctl is not None:
        _prctl(_PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0)  # EINVAL without Yama: fine
    _declared = pid


def host_identity() -> tuple[int, int]:
    """(boot id, pid namespace) of this process: two processes with equal identities see
    the same pids, so one's pid means the same process to the other."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = int(f.read().strip().replace("-", "")[:16], 16)
        return boot, os.stat("/proc/self/ns/pid").st_ino
    except (OSError, ValueError):
        return 0, 0


def supported() -> bool:
    """True where the system call exists (Linux); permission is only known by trying."""
    return _process_vm_readv is not None


def read_into(pid: int, address: int, target: np.ndarray) -> None:
    """Copy ``target.nbytes`` bytes at ``address`` in process ``pid`` into ``target``.

    ``target`` must be C-contiguous and writable. Raises OSError (PermissionError where
    the kernel forbids it, ProcessLookupError when ``pid`` is gone, errno EFAULT when the
    range is not mapped there). The GIL is released while the kernel copies.
    """
    if _process_vm_readv is None:
        raise OSError(f"process_vm_readv is not available on {sys.platform}")
    if not (target.flags.c_contiguous and target.flags.writeable):
        raise ValueError("target must be a writable C-contiguous array")
    done, total, base = 0, target.nbytes, target.ctypes.data
    while done < total:  # the kernel may stop early (e.g. at a page it cannot read)
        local = _IOVec(base + done, total - done)
        remote = _IOVec(address + done, total - done)
        n = _process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if n <= 0:
            err = ctypes.get_errno() if n < 0 else errno.EFAULT  # 0 bytes read
            raise OSError(err, f"process_vm_readv from pid {pid}: {os.strerror(err)}")
        done += n
