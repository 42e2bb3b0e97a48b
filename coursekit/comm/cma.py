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
``ptrace_scope=1`` (Ubuntu's default) only ancestors may read a process, not sibling
engines; :func:`allow_readers` lifts that for the calling process, as Open MPI's shared
memory transport does. Not available off Linux.
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
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1)


def allow_readers() -> None:
    """Let any process of this user read this one under Yama ``ptrace_scope=1``.

    ``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)``; without Yama (or off Linux) it does
    nothing. It grants no more than ``ptrace_scope=0``, the kernel's own default.
    """
    if _prctl is not None:
        _prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)  # EINVAL without Yama: fine


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
