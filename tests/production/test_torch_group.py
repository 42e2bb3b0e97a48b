"""torch.distributed's process group on the ranks of a course Comm (coursekit.production.torch_group)."""

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


def test_loopback_is_an_interface_of_this_host_and_an_unknown_address_is_refused():
    assert torch_group.interface_of("127.0.0.1")  # "lo" on Linux
    with pytest.raises(ValueError, match="192.0.2.1"):
        torch_group.interface_of("192.0.2.1")  # TEST-NET-1: documentation only, never a host's


def test_an_unknown_backend_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match="gloo"):
        torch_group.choose_backend(None, "tcp")
