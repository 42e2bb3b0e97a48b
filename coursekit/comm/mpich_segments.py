"""MPICH's bootstrap segment in /dev/shm, unlinked once every rank on the host has mapped it.

``MPI_Init`` in MPICH (the ``mpich`` wheel; Intel MPI and MVAPICH derive from it) creates
one POSIX shared-memory file per host and job, ``/dev/shm/mpich_shm_<id>_0`` (about 1 MiB
per rank on the host; a singleton, a process that initializes MPI without mpiexec, makes
one too), through which the host's ranks exchange their addresses. Every later segment MPICH
unlinks as soon as all its ranks have mapped it; this one keeps its name until
``MPI_Finalize``. An engine never finalizes: a cluster ends its engines with signals
(``ipcluster stop``, ``scancel``, the reaper of a SIGKILLed kernel), so every MPI cluster
left a 1 MiB file per host and engine set in /dev/shm, for good (the cluster tests left 4 to
7 a run).

The name is needed only while the ranks attach. ``MPI_Init`` returns only after every rank on
the host has attached (they read each other's addresses through the segment), so a rank whose
``MPI_Init`` returned may unlink it: the memory stays mapped in every rank, and the kernel
frees it when the last of them exits, however it exits. Checked with the ``mpich`` wheel
(4.x): 4 ranks that unlink it, then run collectives, create communicators and a shared
window, and finalize, exit with 0.

Linux only (``/proc/self/maps``); elsewhere nothing is found and nothing is unlinked.
"""

from __future__ import annotations

import os

__all__ = ["SEGMENT_PREFIX", "forget_bootstrap_segments", "named_segments"]

SEGMENT_PREFIX = "/dev/shm/mpich_shm_"
"""How MPICH names its POSIX shared-memory files."""


def named_segments(maps: str = "/proc/self/maps") -> dict[str, int]:
    """``{path: inode}`` of the MPICH segments this process maps whose name still exists
    (a line of ``maps`` is ``address perms offset dev inode path``, the path followed by
    `` (deleted)`` once unlinked)."""
    found = {}
    try:
        with open(maps) as lines:
            for line in lines:
                fields = line.rstrip("\n").split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(SEGMENT_PREFIX) \
                        and not fields[5].endswith(" (deleted)"):
                    found[fields[5]] = int(fields[4])
    except OSError:  # no /proc (macOS)
        pass
    return found


def forget_bootstrap_segments() -> list[str]:
    """Unlink the names of the MPICH segments this process maps; return those it unlinked.

    Call it after ``MPI_Init`` (any ``from mpi4py import MPI``) has returned. A name is
    unlinked only while it still names the file this process maps (same inode), so a file
    another job has since created under the same name is left alone; a name a peer on this
    host unlinked first is skipped."""
    unlinked = []
    for path, inode in named_segments().items():
        try:
            if os.stat(path).st_ino == inode:
                os.unlink(path)
                unlinked.append(path)
        except FileNotFoundError:
            pass
    return unlinked
