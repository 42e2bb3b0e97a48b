"""Message-level attacks on the comm of a real 3-engine cluster (issue 29): after each class
of hostile frames, three allreduces are exact on every rank -- the frames are dropped where
they are read -- and no rank ever returns a wrong sum (``coursekit.comm.attacks``;
``bench/fault_attacks.py`` prints the same figures)."""

import pytest
from ipyparallel import interactive  # ship the engine functions by value

from coursekit import cluster
from coursekit.comm import attacks, call_with_comm, reset_comm, setup_comm

pytestmark = [pytest.mark.cluster, pytest.mark.slow]  # slow: a failing run waits out 3 s timeouts


@pytest.fixture(scope="module")
def three():
    """A cluster of this module's own: the attacks break comms (rebuilt after each)."""
    with cluster.start(n=3) as c:
        setup_comm(c, timeout=3)
        yield c


@pytest.mark.parametrize("attack", attacks.ATTACKS)
def test_hostile_frames_are_dropped_and_every_allreduce_is_exact(three, attack):
    reset_comm(three)  # a fresh comm for each attack
    result = attacks.run_attack(three, attack, seed=29)
    assert result.wrong == 0, result.outcomes
    assert result.verdict == "exact", result.outcomes
    if attack.endswith("during collectives"):
        return  # its frames may come after the last collective: nobody has read them yet
    rejected = three.run(call_with_comm, _rejected)
    for rank in result.ranks:  # each rank that got frames dropped them, naming the sender
        count, last = rejected[rank]
        assert count >= 1 and last.startswith(f"rank {rank}: dropped a frame from 127.0.0.1 "
                                              "that failed authentication"), (rank, rejected)


@interactive
def _rejected(comm):
    """What the rank dropped, after a short receive nothing answers: ranks that talk over
    shared-memory lanes read their socket only while they wait (here, if not before)."""
    from coursekit.comm import CommTimeout
    saved, comm.timeout = comm.timeout, 0.3
    try:
        comm.recv()
    except CommTimeout:
        pass
    finally:
        comm.timeout = saved
    return comm.rejected, comm.last_rejected


def test_a_comm_whose_collective_broke_off_refuses_until_it_is_rebuilt(three):
    """A peer that never answers (here: rank 2 sleeps through the first allreduce) breaks
    the collective: the ranks that timed out refuse every later call, with no sum."""
    reset_comm(three)
    outcomes = three.run(call_with_comm, _rank2_late, timeout=60)
    for rank, (first, later) in enumerate(outcomes):
        assert first.startswith(f"CommTimeout: rank {rank}:"), outcomes
        assert later == ["CommError: refused"] * 2, outcomes
    reset_comm(three)
    assert three.run(call_with_comm, attacks.allreduce_outcomes, 1) == [["exact"]] * 3


@interactive
def _rank2_late(comm):
    import time

    from coursekit.comm.attacks import allreduce_outcomes
    if comm.rank == 2:
        time.sleep(4)  # past the others' 3 s timeout: they break off and refuse
    first, *later = allreduce_outcomes(comm, 3)
    return first, ["CommError: refused" if "refuses further use" in o else o for o in later]
