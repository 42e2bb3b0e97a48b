"""Sub-communicators: ranks translated both ways, barrier and tracing through the parent."""

import numpy as np
import pytest

from coursekit.comm import ANY_SOURCE, CommError, SubComm, first_ranks, run_local, subcomm


def ring_in_group(comm, members):
    group = subcomm(comm, members)
    if group is None:
        return None
    right, left = (group.rank + 1) % group.size, (group.rank - 1) % group.size
    got = group.sendrecv(np.array([comm.rank]), right, source=left)
    group.barrier()
    return group.rank, group.size, int(got[0])


def test_group_ranks_are_positions_in_members_and_messages_arrive_translated():
    members = [4, 1, 3]  # group ranks 0, 1, 2 are parent ranks 4, 1, 3
    out = run_local(ring_in_group, 5, members)
    assert out[0] is None and out[2] is None
    # group rank g receives from group rank g-1, i.e. from parent rank members[g-1]
    assert out[4] == (0, 3, 3) and out[1] == (1, 3, 4) and out[3] == (2, 3, 1)


def traced_pair(comm):
    comm.tracing = True
    pair = first_ranks(comm, 2)
    if pair is not None:
        if pair.rank == 0:
            pair.send(np.zeros(4), 1, tag=3)
        else:
            pair.recv(0, tag=3)
    return [(m.op, m.src, m.dst, m.tag, m.nbytes) for m in comm.trace]


def test_group_messages_are_traced_in_the_parent_with_parent_ranks():
    out = run_local(traced_pair, 3)
    assert out[0] == [("send", 0, 1, 3, 32)]
    assert out[1] == [("recv", 0, 1, 3, 32)]
    assert out[2] == []


def stray_message(comm):
    group = subcomm(comm, [0, 1])
    if comm.rank == 2:
        comm.send(np.ones(1), 0, tag=5)  # from outside the group
        return None
    if group.rank == 0:
        with pytest.raises(CommError, match=r"got a message from rank 2, which is not in the group"):
            group.recv(ANY_SOURCE, tag=5)
    return "ok" if group.rank == 0 else None


def test_any_source_from_outside_the_group_is_an_error():
    assert run_local(stray_message, 3)[0] == "ok"


def test_whole_comm_is_returned_and_bad_members_are_rejected():
    def build(comm):
        assert subcomm(comm, range(comm.size)) is comm
        assert isinstance(subcomm(comm, [1, 0]), SubComm)
        for bad in ([], [0, 0], [0, 3]):
            with pytest.raises(ValueError, match="members must be distinct ranks of this comm"):
                subcomm(comm, bad)
        with pytest.raises(ValueError, match=r"the number of workers must be an int in 1\.\.2"):
            first_ranks(comm, 3)
        return True

    assert run_local(build, 2) == [True, True]


def _group_peers(comm):
    from coursekit.comm import subcomm
    group = subcomm(comm, [2, 0])
    return (None if group is None else
            (sorted(group.shared_memory_peers), sorted(group.single_copy_peers)))


def test_a_group_reports_its_members_lane_and_single_copy_peers_in_group_ranks():
    from coursekit.comm.procs import run_procs
    got = run_procs(_group_peers, 3, timeout=30)
    assert got[1] is None
    assert got[0] == ([0, 1], [0]) and got[2] == ([0, 1], [1])  # group ranks: 2 -> 0, 0 -> 1



SPOIL = {"closed": (lambda comm: comm.close(), "is closed"),
         "interrupted": (lambda comm: comm._mark_interrupted(("recv", 1, 0)), "was interrupted"),
         "broken": (lambda comm: comm._mark_broken("bcast", ValueError("a bug")), "broke off")}


@pytest.mark.parametrize("how", SPOIL)
def test_a_group_refuses_every_call_once_its_parent_does(how):
    """The parent may be closed, interrupted or broken by traffic outside the group."""
    from coursekit.comm import ThreadComm
    parents = ThreadComm.world(3, timeout=5)
    group = subcomm(parents[0], [0, 2])
    group.send(np.ones(2), 1)  # usable while the parent is
    assert parents[2].recv(0).tolist() == [1.0, 1.0]
    spoil, words = SPOIL[how]
    spoil(parents[0])
    for call in (lambda: group.send(np.ones(2), 1), lambda: group.recv(1),
                 lambda: group.sendrecv(np.ones(2), 1, source=1)):
        with pytest.raises(CommError, match=words):
            call()
    for comm in parents:
        comm.close()


@pytest.mark.parametrize("how", ["interrupted", "broken"])
def test_a_group_that_breaks_makes_its_parent_refuse(how):
    from coursekit.comm import ThreadComm
    parents = ThreadComm.world(3, timeout=5)
    spoil, words = SPOIL[how]
    spoil(subcomm(parents[0], [0, 2]))
    with pytest.raises(CommError, match=words):
        parents[0].send(np.ones(1), 1)
    parents[1].send(np.ones(1), 2)  # the other ranks' comms are untouched
    assert parents[2].recv(1).tolist() == [1.0]
    for comm in parents:
        comm.close()
