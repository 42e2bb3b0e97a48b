"""torch.distributed's process group on the ranks of a course Comm (coursekit.production.torch_group)."""

import threading
import time

import pytest
from ipyparallel import interactive  # ship the engine functions by value

from coursekit.cluster.runner import RankFailure
from coursekit.production import torch_group

pytest.importorskip("torch", reason="the torch extra is not installed (pip install -e '.[torch]')")


def engines(cluster):
    """A runner on the engines of ``cluster`` with a fresh course Comm (10 s timeout)."""
    from coursekit.cluster.runner import ClusterRunner
    from coursekit.comm import setup_comm
    setup_comm(cluster, timeout=10)
    return ClusterRunner(cluster, timeout=120)


@interactive
def _group_facts(comm):
    import torch
    import torch.distributed as dist
    from coursekit.production.torch_group import process_group
    with process_group(comm):
        x = torch.tensor([2.0 ** comm.rank], dtype=torch.float64)
        dist.all_reduce(x)
        facts = (dist.get_rank(), dist.get_world_size(), dist.get_backend(), float(x[0]))
    import os
    return facts, dist.is_initialized(), os.environ.get("GLOO_SOCKET_IFNAME")


@pytest.mark.cluster
def test_group_ranks_are_the_comms_ranks_and_the_group_ends_with_the_block(cluster4):
    runner = engines(cluster4)
    for k in (4, 2):  # the whole cluster, then its first two ranks (a sub-comm)
        got = runner.run(_group_facts, ranks=k)
        assert [facts[:3] for facts, _, _ in got] == [(r, k, "gloo") for r in range(k)]
        assert all(facts[3] == 2 ** k - 1 for facts, _, _ in got)  # each rank's bit once
        assert [alive for _, alive, _ in got] == [False] * k
        assert [ifname for _, _, ifname in got] == [None] * k  # the setting is not left behind


@interactive
def _fail_inside(comm):
    from coursekit.production.torch_group import process_group
    with process_group(comm):
        raise ValueError(f"rank {comm.rank} fails inside the block")


@interactive
def _still_initialized(comm):
    import torch.distributed as dist
    return dist.is_initialized()


@pytest.mark.cluster
def test_a_failing_block_leaves_no_group_and_the_next_one_works(cluster2):
    runner = engines(cluster2)
    with pytest.raises(RankFailure, match="fails inside the block"):
        runner.run(_fail_inside)
    assert runner.run(_still_initialized) == [False, False]
    assert [facts[3] for facts, _, _ in runner.run(_group_facts)] == [3.0, 3.0]


@interactive
def _only_rank_0_joins(comm):
    from coursekit.production.torch_group import process_group
    if comm.rank == 0:
        with process_group(comm, timeout=2.0):
            pass


@pytest.mark.cluster
def test_a_rank_that_never_joins_is_an_error_not_a_hang(cluster2):
    with pytest.raises(RankFailure, match="rank 0"):
        engines(cluster2).run(_only_rank_0_joins, timeout=60)


@interactive
def _callback_holds_the_group(comm, hold_s):
    """Rank 0's allreduce future gets a Python callback (as a comm hook's ``Future.then``)
    that holds the group and returns ``hold_s`` seconds after the collective, so a gloo
    worker thread drops that reference after the block has ended (rank 1 joins late: the
    callback is attached before the future completes). Returns how many groups the block
    left in KEPT_GROUPS."""
    import time

    import torch
    import torch.distributed as dist
    from coursekit.production import torch_group

    def holding(group):
        def late(future):
            time.sleep(hold_s)
            return group is not None
        return late

    kept = len(torch_group.KEPT_GROUPS)
    with torch_group.process_group(comm):
        if comm.rank == 1:
            time.sleep(0.3)
        future = dist.all_reduce(torch.ones(4), async_op=True).get_future()
        future.then(holding(dist.group.WORLD))
        future.wait()  # returns once the allreduce is done, while the callback still runs
    time.sleep(hold_s + 0.2)  # by now the callback has dropped its reference
    return len(torch_group.KEPT_GROUPS) - kept


@pytest.mark.cluster
def test_a_group_a_gloo_thread_still_holds_is_never_freed_on_that_thread(cluster2):
    """Freed there, the group's destructor joins its own thread and the engine aborts
    ("Resource deadlock avoided": seen in CI with powerSGD_hook; here with plain
    destroy_process_group, every run)."""
    runner = engines(cluster2)
    short = torch_group.GROUP_RELEASE_WAIT_S / 5
    assert runner.run(_callback_holds_the_group, short) == [0, 0]  # waited for, freed here
    kept = runner.run(_callback_holds_the_group, torch_group.GROUP_RELEASE_WAIT_S + 0.5)
    assert kept[0] == 1  # still held when the wait ran out: kept, not freed on gloo's thread
    assert [facts[3] for facts, _, _ in runner.run(_group_facts)] == [3.0, 3.0]


class _Tracked:
    """Records which thread frees it."""

    def __init__(self, freed_on: list):
        self.freed_on = freed_on

    def __del__(self):
        self.freed_on.append(threading.get_ident())


def _hold_in_a_thread(obj, seconds: float) -> threading.Thread:
    """A thread that holds ``obj`` for ``seconds`` and then drops it."""
    held = [obj]

    def hold():
        time.sleep(seconds)
        held.clear()

    thread = threading.Thread(target=hold)
    thread.start()
    return thread


def test_an_object_another_thread_drops_late_is_freed_by_the_caller():
    freed_on = []
    box = [_Tracked(freed_on)]
    thread = _hold_in_a_thread(box[0], 0.05)
    assert torch_group.free_on_this_thread(box, wait_s=5.0)
    thread.join()
    assert freed_on == [threading.get_ident()] and box == []


def test_an_object_held_past_the_wait_is_kept_never_freed_by_the_late_thread():
    freed_on = []
    box = [_Tracked(freed_on)]
    thread = _hold_in_a_thread(box[0], 0.3)
    assert not torch_group.free_on_this_thread(box, wait_s=0.05)
    thread.join()
    assert freed_on == []  # the late thread let go, the kept reference did not
    kept = torch_group.KEPT_GROUPS.pop()
    assert isinstance(kept, _Tracked)
    del kept
    assert freed_on == [threading.get_ident()]


def test_loopback_is_an_interface_of_this_host_and_an_unknown_address_is_refused():
    assert torch_group.interface_of("127.0.0.1")  # "lo" on Linux
    with pytest.raises(ValueError, match="192.0.2.1"):
        torch_group.interface_of("192.0.2.1")  # TEST-NET-1: documentation only, never a host's


def test_an_unknown_backend_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match="gloo"):
        torch_group.choose_backend(None, "tcp")
