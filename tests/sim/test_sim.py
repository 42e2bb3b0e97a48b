"""coursekit.sim: closed forms against replays of the real collectives, and against costmodel."""

import numpy as np
import pytest

from coursekit import costmodel
from coursekit.sim import (Compute, Deadlock, Network, Recv, Send, allreduce_time, replay,
                           trace_collective)

HOMOGENEOUS = Network(4, 2, 1e-5, 1e-9, 1e-5, 1e-9, gamma=0.0, nics_per_node=4)
TWO_LEVEL = Network(4, 2, 2e-6, 1e-10, 2e-5, 1e-9, nics_per_node=4)
WIDE = Network(2, 4, 2e-6, 1e-10, 2e-5, 1e-9, nics_per_node=2)
TRACED = {"ring": "ring", "tree": "reduce_bcast", "hierarchical": "hierarchical"}


@pytest.mark.parametrize("net", [HOMOGENEOUS, TWO_LEVEL, WIDE], ids=["flat", "4x2", "2x4"])
@pytest.mark.parametrize("algorithm", ["ring", "tree", "hierarchical"])
def test_replay_of_real_collective_matches_closed_form(net, algorithm):
    """Replaying the messages the course's collectives really send gives the formula."""
    nbytes = 1 << 18
    programs = trace_collective(net.p, nbytes, TRACED[algorithm],
                                ranks_per_node=net.ranks_per_node)
    simulated = replay(programs, net).makespan
    assert simulated == pytest.approx(allreduce_time(net, nbytes, algorithm), rel=1e-9)


@pytest.mark.parametrize("p", [2, 5, 8, 13])
def test_one_level_equals_costmodel(p):
    net = Network(p, 1, 3e-6, 2e-10, 1.0, 1.0, gamma=1e-11)
    n = 10_000.0
    assert allreduce_time(net, n, "ring") == pytest.approx(
        costmodel.predict("allreduce", "ring", p, n, 3e-6, 2e-10, 1e-11))
    assert allreduce_time(net, n, "tree") == pytest.approx(
        costmodel.predict("allreduce", "reduce_bcast", p, n, 3e-6, 2e-10, 1e-11))
    # one node: hierarchical = reduce-scatter + allgather = the ring
    assert allreduce_time(net, n, "hierarchical") == pytest.approx(
        allreduce_time(net, n, "ring"))


def test_hierarchical_hand_computed():
    # k = 8 per node, m = 4 nodes, one NIC shared by the 8 inter-node flows
    net = Network(8, 4, 1e-6, 1e-10, 1e-5, 1e-9)
    n = 8e6
    intra = 2 * 7 * 1e-6 + 2 * 7 / 8 * n * 1e-10
    inter = 2 * 3 * 1e-5 + 2 * 3 / 4 * (n / 8) * (8 * 1e-9)
    assert allreduce_time(net, n, "hierarchical") == pytest.approx(intra + inter)
    flat = 2 * 31 * 1e-5 + 2 * 31 / 32 * n * 1e-9
    assert allreduce_time(net, n, "ring") == pytest.approx(flat)


def test_hierarchical_pays_fewer_latencies_at_scale():
    net = Network(8, 256, 5e-6, 1e-10, 2e-5, 1e-10)
    small = 1 << 12
    assert allreduce_time(net, small, "hierarchical") < allreduce_time(net, small, "ring") / 5


def test_single_worker_costs_nothing():
    net = Network(1, 1, 1e-6, 1e-9, 1e-6, 1e-9)
    assert allreduce_time(net, 1e6, "ring") == 0.0
    assert np.all(allreduce_time(net, np.array([1.0, 2.0]), "tree") == 0.0)


def test_replay_compute_and_messages():
    net = Network(2, 1, 1e-3, 1e-6, 1.0, 1.0)
    programs = [[Compute(0.5), Send(1, 1000, tag=3)], [Recv(0, tag=3), Compute(0.25)]]
    r = replay(programs, net)
    assert r.finish.tolist() == pytest.approx([0.5 + 1e-3 + 1e-3, 0.5 + 2e-3 + 0.25])
    assert {(s.rank, s.kind) for s in r.spans} == {(0, "compute"), (0, "send"), (1, "idle"),
                                                    (1, "compute")}


def test_replay_sends_share_the_senders_link():
    net = Network(3, 1, 1e-3, 1e-9, 1.0, 1.0)
    programs = [[Send(1, 0), Send(2, 0)], [Recv(0)], [Recv(0)]]
    assert replay(programs, net).finish.tolist() == pytest.approx([2e-3, 1e-3, 2e-3])


def test_replay_deadlock_is_reported():
    net = Network(2, 1, 1e-6, 1e-9, 1e-6, 1e-9)
    with pytest.raises(Deadlock, match="rank 0 waits"):
        replay([[Recv(1)], [Recv(0)]], net)


@pytest.mark.parametrize("programs, match", [
    ([[Send(0, 1)], []], "names rank 0"),
    ([[Send(5, 1)], []], "names rank 5"),
    ([[Compute(-1.0)], []], "compute time"),
    ([[]], "1 programs for a network of 2"),
    ([["send"], []], "unknown op"),
])
def test_replay_bad_programs(programs, match):
    net = Network(2, 1, 1e-6, 1e-9, 1e-6, 1e-9)
    with pytest.raises((ValueError, TypeError), match=match):
        replay(programs, net)


@pytest.mark.parametrize("field, value", [
    ("ranks_per_node", 0), ("nodes", -1), ("alpha_intra", 0.0), ("beta_inter", -1e-9),
    ("gamma", -1.0), ("nics_per_node", 0), ("alpha_inter", float("nan")), ("nodes", 2.5),
])
def test_network_rejects_bad_parameters(field, value):
    kw = dict(ranks_per_node=2, nodes=2, alpha_intra=1e-6, beta_intra=1e-9, alpha_inter=1e-6,
              beta_inter=1e-9)
    kw[field] = value
    with pytest.raises(TypeError if value == 2.5 else ValueError, match=field):
        Network(**kw)


def test_allreduce_time_rejects_bad_input():
    net = Network(2, 2, 1e-6, 1e-9, 1e-6, 1e-9)
    with pytest.raises(ValueError, match="allowed"):
        allreduce_time(net, 10, "butterfly")
    with pytest.raises(ValueError, match="nbytes"):
        allreduce_time(net, -1, "ring")


def test_from_bandwidths():
    net = Network.from_bandwidths(8, 2, intra_latency=1e-6, intra_bandwidth=1e10,
                                  inter_latency=2e-6, inter_bandwidth=5e9)
    assert (net.beta_intra, net.beta_inter, net.p) == (1e-10, 2e-10, 16)
    with pytest.raises(ValueError, match="inter_bandwidth"):
        Network.from_bandwidths(8, 2, intra_latency=1e-6, intra_bandwidth=1e10,
                                inter_latency=2e-6, inter_bandwidth=0)
