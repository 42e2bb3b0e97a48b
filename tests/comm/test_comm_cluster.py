"""setup_comm on a real local ipyparallel cluster: ZmqComm between engines."""

import numpy as np
import pytest

from coursekit.comm import call_with_comm, engine_comm, engine_trace, setup_comm, teardown_comm
from coursekit.comm.examples import ring_exchange


def test_zmq_ring_between_three_engines(cluster3):
    c = cluster3  # the run's shared 3-engine cluster: the comm is torn down at the end
    assert setup_comm(c, timeout=10, trace=True) == "zmq"
    got = c.run(call_with_comm, ring_exchange, 6, timeout=30)
    for r, y in enumerate(got):
        np.testing.assert_array_equal(y, np.arange(6) + 100 * ((r - 1) % 3))
    traces = c.run(engine_trace, True, timeout=30)
    assert [(m.op, m.src, m.dst, m.nbytes) for m in traces[1]] == [
        ("send", 1, 2, 48), ("recv", 0, 1, 48)]
    assert c.run(engine_trace, timeout=30) == [[], [], []]  # cleared
    with pytest.raises(ValueError, match="needs engines launched with MPI"):
        setup_comm(c, backend="mpi")
    teardown_comm(c)
    with pytest.raises(Exception, match="no Comm on this engine"):
        c.run(engine_comm, timeout=30)


def test_bad_backend_name():
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'zmq', 'mpi'\)"):
        setup_comm(object(), backend="tcp")


@pytest.mark.cluster
@pytest.mark.mpi
def test_auto_picks_mpi_on_mpi_engines():
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install '.[mpi]')")
    from coursekit import cluster
    with cluster.start(n=3, engines="mpi") as c:
        assert setup_comm(c, timeout=10) == "mpi"
        got = c.run(call_with_comm, ring_exchange, 2, timeout=30)
        for r, y in enumerate(got):
            np.testing.assert_array_equal(y, np.arange(2) + 100 * ((r - 1) % 3))


class FakeCluster:
    """What _default_interface reads: the engines' hosts and the controller's address."""

    def __init__(self, hosts, interface, location=None):
        from types import SimpleNamespace
        self.hosts = hosts
        self.client = SimpleNamespace(_config={"interface": interface, "location": location})

    def run(self, fn):
        return list(self.hosts)


@pytest.mark.parametrize("hosts, interface, location, expected", [
    (["a", "a"], "tcp://10.1.2.3", None, "127.0.0.1"),              # one host: loopback
    (["a", "b"], "tcp://10.1.2.3", "login1", "towards:10.1.2.3"),  # the controller's address
    (["a", "b"], "tcp://*", "login1", "towards:login1"),           # every interface: its host
    (["a", "b"], "tcp://0.0.0.0", "10.9.9.9", "towards:10.9.9.9"),
])
def test_engines_on_several_hosts_bind_towards_the_controller(hosts, interface, location,
                                                              expected):
    from coursekit.comm.cluster_setup import _default_interface
    assert _default_interface(FakeCluster(hosts, interface, location)) == expected


def test_a_wildcard_controller_without_location_needs_an_interface():
    from coursekit.comm import CommError
    from coursekit.comm.cluster_setup import _default_interface
    with pytest.raises(CommError, match=r"pass setup_comm\(cluster, interface=...\)"):
        _default_interface(FakeCluster(["a", "b"], "tcp://*"))
