"""A collective that breaks off on one rank makes that rank's comm refuse every later call,
so the messages it left in flight are never taken for the next collective's (ThreadComm
ranks; tests/comm/test_comm_attacks.py does it between engines)."""

import threading
import time

import numpy as np
import pytest

from coursekit.collectives import allreduce
from coursekit.comm import CommError, CommTimeout, ThreadComm, first_ranks


def _outcome(comm, value, check):
    try:
        return allreduce(comm, np.full(4, value), check=check).tolist()
    except CommError as exc:
        return f"{type(exc).__name__}: {exc}"


def _late_peer(comm, check):
    """Rank 1 comes 0.6 s late; rank 0 gives up on the first allreduce after 0.3 s and calls
    the next one at once: rank 1's first allreduce finds rank 0's messages of both."""
    if comm.rank == 1:
        time.sleep(0.6)
        comm.timeout = 2.0
        return [_outcome(comm, 100.0, check)]
    first = _outcome(comm, 1.0, check)
    comm.timeout = 5.0
    return [first, _outcome(comm, 10.0, check)]


def _run(fn, comms, *args):
    results = [None] * len(comms)

    def body(comm):
        results[comm.rank] = fn(comm, *args)

    threads = [threading.Thread(target=body, args=(c,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    return results


@pytest.mark.slow  # waits out comm timeouts (0.3 s, 2 s)
@pytest.mark.parametrize("check", [True, False])
def test_a_collective_that_timed_out_leaves_no_message_for_the_next_one(check):
    (first, second), (late,) = _run(_late_peer, ThreadComm.world(2, timeout=0.3), check)
    assert first.startswith("CommTimeout: rank 0: sendrecv"), first
    # without the guard rank 0's second call and rank 1's call both returned
    # [110, 110, 101, 101] on check=False (half of it the first call's sum; [110] * 4 on
    # check=True, which rank 1 took for its own call's)
    assert second.startswith("CommError: rank 0: this ThreadComm broke off allreduce with "
                             "CommTimeout: rank 0: sendrecv"), second
    assert "refuses further use: rebuild it (coursekit.comm.reset_comm" in second
    assert late.startswith("CommTimeout: rank 1:"), late  # it waits for rank 0, in vain


def test_an_error_inside_a_collective_marks_the_comm_broken_and_every_call_refuses():
    comm = ThreadComm.world(2, timeout=1)[0]
    with pytest.raises(ZeroDivisionError):
        with comm.collective("allreduce"):
            raise ZeroDivisionError("a bug between two messages")
    assert comm.broken == "allreduce with ZeroDivisionError: a bug between two messages"
    with comm.collective("bcast"):
        pass  # a block that raises nothing changes nothing ...
    with pytest.raises(CommError, match="broke off allreduce with ZeroDivisionError"):
        with comm.collective("bcast"):  # ... but the refusal keeps the first cause
            comm.send(np.ones(1), 1)
    for call in (lambda: comm.recv(1), comm.barrier, lambda: allreduce(comm, np.ones(2))):
        with pytest.raises(CommError, match=r"^rank 0: this ThreadComm broke off allreduce"):
            call()


def test_a_keyboard_interrupt_between_two_messages_marks_the_comm_interrupted():
    comm = ThreadComm.world(2, timeout=1)[0]
    with pytest.raises(KeyboardInterrupt):
        with comm.collective("allreduce"):
            raise KeyboardInterrupt
    assert comm.interrupted == "allreduce()" and comm.broken is None
    with pytest.raises(CommError, match=r"was interrupted in allreduce\(\).*reset_comm"):
        comm.send(np.ones(1), 1)


def _group_breaks(comm):
    """Ranks 0 and 1 allreduce in a group; rank 1 never comes, so rank 0's group breaks."""
    group = first_ranks(comm, 2)
    if comm.rank != 0:
        return None
    with pytest.raises(CommTimeout):
        allreduce(group, np.ones(3))
    with pytest.raises(CommError, match="broke off allreduce"):
        comm.send(np.ones(1), 2)  # the parent's stream holds the group's stale messages
    return comm.broken


@pytest.mark.slow  # waits out a 0.3 s comm timeout
def test_a_group_collective_that_breaks_off_breaks_the_parent_comm():
    assert _run(_group_breaks, ThreadComm.world(3, timeout=0.3))[0].startswith(
        "allreduce with CommTimeout: rank 0:")


def _mismatch_then_sum(comm):
    """The ranks disagree on the shape: every rank raises the same ValueError after the
    whole fingerprint exchange, so no message is left behind and the comm stays usable."""
    try:
        allreduce(comm, np.ones(2 + comm.rank))
    except ValueError as exc:
        error = str(exc)
    return error, comm.broken, allreduce(comm, np.full(3, comm.rank + 1.0)).tolist()


def test_a_mismatch_found_by_the_fingerprint_check_does_not_break_the_comm():
    for error, broken, total in _run(_mismatch_then_sum, ThreadComm.world(3, timeout=5)):
        assert "needs the same dtype and shape on every rank" in error
        assert broken is None and total == [6.0] * 3
