"""A peer that dies in the middle of a collective: the survivors get CommTimeout, no hang
(PeerGone, at once, where they wait on a dead process of their host through a lane).

Real OS processes over ZmqComm (``run_procs``); the dying rank calls ``os._exit`` at the
start of the collective, as if its node failed.
"""

import os
import re

import numpy as np
import pytest

from coursekit.comm.procs import run_procs

TIMEOUT = 1.5

# three processes per test, and the survivors wait out their timeout
pytestmark = pytest.mark.slow


def collective_with_a_dying_rank(comm, dying, collective, algorithm):
    from coursekit import collectives
    from coursekit.comm import CommTimeout

    if comm.rank == dying:
        os._exit(3)
    try:
        collectives.FUNCTIONS[collective](comm, np.ones(1000), algorithm=algorithm, check=False)
    except CommTimeout as exc:
        return str(exc)
    return "finished"


@pytest.mark.parametrize("collective, algorithm, everyone_waits", [
    ("allreduce", "ring", True),                # every result needs every rank's data
    ("allreduce", "recursive_doubling", True),
    ("reduce", "binomial", False),              # only the root waits for the dead rank
])
def test_survivors_time_out_naming_a_peer(collective, algorithm, everyone_waits):
    p, dying = 3, 2
    results = run_procs(collective_with_a_dying_rank, p, dying, collective, algorithm,
                        timeout=TIMEOUT, may_die={dying})
    assert results[dying] is None
    survivors = [r for rank, r in enumerate(results) if rank != dying]
    stopped = re.compile(rf"(timed out after {TIMEOUT:g} s|stopped) waiting for rank")
    timed_out = [r for r in survivors if stopped.search(r)]
    assert timed_out == survivors if everyone_waits else timed_out, survivors
    # whoever was waiting on the dead rank names it
    assert any(f"waiting for rank {dying}" in r for r in timed_out), survivors
    # on this host that rank's lane says at once that its process has exited
    assert any(f"stopped waiting for rank {dying}" in r and "its process has exited" in r
               for r in timed_out), survivors


def test_an_unexpected_death_is_still_an_error():
    from coursekit.comm import CommError

    with pytest.raises(CommError, match="rank 2 died"):
        run_procs(collective_with_a_dying_rank, 3, 2, "allreduce", "ring", timeout=TIMEOUT)
