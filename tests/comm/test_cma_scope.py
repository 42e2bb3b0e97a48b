"""Who may read a rank's memory for single copy: the ranks' nearest common ancestor and its
descendants only, withdrawn when the comm closes.

This machine has no Yama LSM (and runs as root), so the kernel's enforcement itself is not
checked here; what is checked is which process each rank declares with PR_SET_PTRACER.
"""

import json
import os
import subprocess
import sys

import pytest

from coursekit.comm import cma
from coursekit.comm.procs import run_procs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and CMA are Linux")


@pytest.fixture
def two_siblings():
    """A shell with two sleeping children: (shell pid, [child pids])."""
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & echo $!; wait"],
                             stdout=subprocess.PIPE, text=True)
    try:
        shell.stdout.readline()
        children = []
        for _ in range(100):
            children = [int(p) for p in open(f"/proc/{shell.pid}/task/{shell.pid}/children")
                        .read().split()]
            if len(children) == 2:
                break
        assert len(children) == 2, children
        yield shell.pid, children
    finally:
        for pid in children:
            os.kill(pid, 9)
        shell.kill()
        shell.wait(5)


def test_common_ancestor_is_the_nearest_shared_process(two_siblings):
    shell, (a, b) = two_siblings
    assert cma.common_ancestor([a, b]) == shell
    assert cma.common_ancestor([os.getpid(), a]) == os.getpid()  # a descends from us
    assert cma.process_chain(a)[:3] == [a, shell, os.getpid()]
    assert cma.common_ancestor([1]) is None  # never init: that would be "any process"
    assert cma.common_ancestor([a, 2**22 + 12345]) is None  # a pid that does not exist


def _declared_while_open_and_after_close(comm):
    during = cma.declared_reader()
    comm.close()
    return during, cma.declared_reader(), os.getppid()


def test_ranks_declare_their_launcher_and_withdraw_at_close():
    for during, after, parent in run_procs(_declared_while_open_and_after_close, 3, timeout=20):
        assert during == parent == os.getpid()  # the spawning process, not "any" (-1), not init
        assert after == 0


GRANTS_COMBINE = """
import os
from coursekit.comm import cma
me, parent = os.getpid(), os.getppid()
alone, with_parent = object(), object()
try:
    assert cma.allow_readers(alone, []) == me
    assert cma.declared_reader() == me
    assert cma.allow_readers(with_parent, [parent]) == parent
    assert cma.declared_reader() == parent  # covers both holders' peers
    cma.withdraw_readers(with_parent)
    assert cma.declared_reader() == me  # back to what the remaining holder needs
finally:
    cma.withdraw_readers(alone)
    cma.withdraw_readers(with_parent)
assert cma.declared_reader() == 0
"""


def test_grants_of_several_holders_combine_and_the_last_withdraws():
    # in a child of this process, whose parent (pytest) is never init, whoever started pytest
    done = subprocess.run([sys.executable, "-c", GRANTS_COMBINE], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr


IN_A_PID_NAMESPACE = """
import json, os
from coursekit.comm import cma
print(json.dumps([os.getpid(), os.getppid(), cma.common_ancestor([os.getpid(), 1])]))
"""


def test_pid_1_of_a_child_pid_namespace_is_an_ancestor_like_any_other():
    """Engines started by a container's or ``unshare --pid``'s launcher (pid 1 there) share
    it as their nearest ancestor; the system's init (tested above) never is."""
    shell = ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
             f'{sys.executable} -c "$0" & wait', IN_A_PID_NAMESPACE]
    try:
        run = subprocess.run(shell, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.fail("unshare (util-linux) is needed for this test")
    assert run.returncode == 0, run.stderr
    me, parent, ancestor = json.loads(run.stdout)
    assert parent == 1 and ancestor == 1 and me != 1  # sh is pid 1 in the new namespace
