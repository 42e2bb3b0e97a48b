"""MPICH's bootstrap segment: an MPI rank or singleton killed by SIGKILL leaves no file in
/dev/shm once it has built an MpiComm (or its engine was probed), and only the file the
process maps is ever unlinked."""

import json
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from coursekit.comm.mpich_segments import SEGMENT_PREFIX, forget_bootstrap_segments, named_segments

pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install '.[mpi]')")

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux only")]

# Each rank prints what it mapped under a name before and after, then waits to be killed.
RANK = textwrap.dedent("""
    import json, os, sys, time
    from mpi4py import MPI
    from coursekit.comm.mpich_segments import named_segments
    before = named_segments()
    if sys.argv[1] == "mpicomm":
        from coursekit.comm.mpi import MpiComm
        MpiComm(timeout=10)
    after = named_segments()
    line = {"pid": os.getpid(), "before": list(before), "after": list(after)}
    os.write(1, (json.dumps(line) + "\\n").encode())  # one write: mpiexec merges the ranks
    time.sleep(60)
""")


def _ranks_killed(command: list[str], n: int, timeout: float = 60) -> list[dict]:
    """Start ``command`` (``n`` processes run RANK), read each one's line, SIGKILL them all
    and wait for ``command`` to end; return the lines. Killed after ``timeout`` s."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    try:
        lines = [proc.stdout.readline() for _ in range(n)]
        if not all(lines):
            proc.kill()
            raise AssertionError(f"{n} lines expected from {command[0]} within {timeout} s, "
                                 f"got {lines}; stderr: {proc.stderr.read()}")
        lines = [json.loads(line) for line in lines]
        for line in lines:
            os.kill(line["pid"], signal.SIGKILL)
        proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return lines


def _mpiexec() -> str:
    return str(Path(sys.executable).parent / "mpiexec")


def test_ranks_killed_by_sigkill_after_building_an_mpicomm_leave_no_segment():
    lines = _ranks_killed([_mpiexec(), "-n", "2", sys.executable, "-c", RANK, "mpicomm"], 2)
    before = {path for line in lines for path in line["before"]}
    left = [path for path in before if os.path.exists(path)]
    for path in left:  # a failure here must not leave the leak it reports
        Path(path).unlink()
    assert len(before) == 1, lines  # one bootstrap segment per host and job, named at first
    assert all(line["after"] == [] for line in lines), lines
    assert not left


def test_without_forgetting_it_the_segment_outlives_killed_ranks():
    """The leak the module prevents is real: the same job without MpiComm leaves its file."""
    lines = _ranks_killed([_mpiexec(), "-n", "2", sys.executable, "-c", RANK, "plain"], 2)
    left = {path for line in lines for path in line["after"]}
    try:
        assert len(left) == 1 and all(os.path.exists(path) for path in left), lines
    finally:
        for path in left:
            Path(path).unlink(missing_ok=True)


def test_a_singleton_killed_after_forgetting_leaves_no_segment():
    program = RANK.replace('if sys.argv[1] == "mpicomm":',
                           "from coursekit.comm.mpich_segments import forget_bootstrap_segments\n"
                           "forget_bootstrap_segments()\nif False:")
    [line] = _ranks_killed([sys.executable, "-c", program, "singleton"], 1)
    assert len(line["before"]) == 1 and line["after"] == [], line
    assert not os.path.exists(line["before"][0])


@pytest.fixture
def mapped_segment():
    """A file named like MPICH's segment, mapped by this process; removed afterwards."""
    path = f"{SEGMENT_PREFIX}coursekit_test_{os.getpid()}_0"
    with open(path, "wb+") as f:
        f.truncate(4096)
        mapping = mmap.mmap(f.fileno(), 4096)
    try:
        yield path
    finally:
        mapping.close()
        Path(path).unlink(missing_ok=True)


def test_named_segments_lists_what_is_mapped_under_a_name_and_forgets_only_that(mapped_segment):
    assert named_segments()[mapped_segment] == os.stat(mapped_segment).st_ino
    os.unlink(mapped_segment)  # another job reuses the name: a new file, another inode
    Path(mapped_segment).write_bytes(b"theirs")
    assert mapped_segment not in named_segments()  # ours is "(deleted)" now
    assert forget_bootstrap_segments() == []
    assert Path(mapped_segment).read_bytes() == b"theirs"


def test_forget_unlinks_the_mapped_file(mapped_segment):
    assert forget_bootstrap_segments() == [mapped_segment]
    assert not os.path.exists(mapped_segment) and mapped_segment not in named_segments()
