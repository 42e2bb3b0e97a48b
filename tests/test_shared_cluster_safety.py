"""A notebook attached to a cluster it did not start never destroys it.

The "instructor" starts a cluster; the "notebook" attaches to it with cluster.connect
(what start() does under COURSEKIT_CLUSTER). Chapter 4's worker crash is then simulated
(the worker falls silent and the shards declare it lost through their timeout, as for a
dead process), every engine keeps its process, and the next run on the same engines is
right. Fault injection that would kill an engine is refused with a clear error.
"""

import os

import pytest

from ipyparallel import interactive

from coursekit import cluster
from coursekit.comm import call_with_comm, reset_comm, run_local, setup_comm
from coursekit.data import load_digits
from coursekit.parallel import data_parallel
from coursekit.parallel.param_server import PSConfig, train
from coursekit.parallel.data_parallel.config import DPConfig
from coursekit.cluster.runner import ClusterRunner


def engine_pids(c) -> list[int]:
    return c.run(os.getpid)


@pytest.fixture
def instructor(cluster4):
    """The run's shared 4-engine cluster (tests/conftest.py): its owner is not the notebook."""
    return cluster4


@pytest.fixture
def attached(instructor):
    c = cluster.connect(profile="default", cluster_id=instructor.ipp_cluster.cluster_id, n=4)
    assert not c.owned
    setup_comm(c, timeout=20)
    yield c
    c.stop()


def test_a_crash_on_an_attached_cluster_is_simulated_and_every_engine_lives(attached):
    before = engine_pids(attached)
    cfg = PSConfig(model="asp", steps=40, crash={1: 15}, worker_timeout=1.0,
                   straggler={0: 0.002, 2: 0.002})
    result = train(ClusterRunner(attached, timeout=60), cfg, workers=3)
    assert [w.status for w in result.workers] == ["finished", "crashed", "finished"]
    (lost,) = result.lost  # found through the shards' timeout, as for a dead process
    assert lost["worker"] == 1 and lost["clock"] == 15 and lost["t"] >= 1.0
    assert result.applied == 2 * 40 + 15
    assert engine_pids(attached) == before
    # the next run on the same engines is exact: nothing of the broken one is left in flight
    bsp = PSConfig(model="bsp", steps=10, dtype="float64")
    again = train(ClusterRunner(attached, timeout=60), bsp, workers=3)
    assert again.lost == [] and again.applied == 30


def test_a_crash_that_would_kill_an_engine_is_refused_on_an_attached_cluster(attached):
    before = engine_pids(attached)
    kill = PSConfig(model="asp", steps=20, crash={1: 5}, crash_kills=True)
    with pytest.raises(ValueError, match="would kill an engine process of a cluster this "
                                         "notebook did not start.*crash_kills=False"):
        train(ClusterRunner(attached), kill, workers=3)
    d = load_digits()
    with pytest.raises(ValueError, match=r"crash_rank \(a data-parallel crash ends its engine"):
        data_parallel.train(ClusterRunner(attached), DPConfig(crash_rank=1, crash_step=2),
                            (d.X_train, d.y_train))
    assert engine_pids(attached) == before


@interactive
def leave_a_message(comm):
    import numpy as np
    if comm.rank == 0:
        comm.send(np.full(3, 7.0), dest=1, tag=5)


@interactive
def tag_5_waiting(comm):
    from coursekit.comm import CommTimeout
    comm.timeout, saved = 0.5, comm.timeout
    try:
        return comm.recv(source=0, tag=5).tolist()
    except CommTimeout:
        return None
    finally:
        comm.timeout = saved


def test_reset_comm_drops_messages_in_flight(attached):
    attached.run(call_with_comm, leave_a_message)
    assert reset_comm(attached) == "zmq"
    assert attached.run(call_with_comm, tag_5_waiting) == [None] * 4
    attached.run(call_with_comm, leave_a_message)  # without the reset the message is there
    assert attached.run(call_with_comm, tag_5_waiting)[1] == [7.0] * 3


def test_every_comm_answers_single_copy_peers():
    assert run_local(lambda comm: comm.single_copy_peers, 2) == [frozenset(), frozenset()]
