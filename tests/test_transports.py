"""coursekit.transports and the panels' transport control, on a real 2-engine cluster."""

import pytest

from coursekit import transports
from coursekit.comm import call_with_comm, setup_comm
from coursekit.costmodel import LinkFit
from coursekit.widgets.collectives import CollectivesPanel

pytestmark = pytest.mark.cluster


def _in_use(cluster) -> list:
    return cluster.run(call_with_comm, transports.in_use)


def test_fit_switches_the_engines_and_measures_the_transport(cluster2):
    sizes = [8, 1 << 16, 1 << 20]
    try:
        tcp = transports.fit(cluster2, "tcp", sizes, repeats=3)
        assert _in_use(cluster2) == ["tcp", "tcp"]
        lane = transports.fit(cluster2, "shared memory", sizes, repeats=3)
        assert _in_use(cluster2) == ["shared memory", "shared memory"]
        for f, name in ((tcp, "tcp"), (lane, "shared memory")):
            assert f.transport == name and f.software > 0 and f.link.alpha > 0
            assert list(f.link.sizes) == sizes and (f.link.times > 0).all()
    finally:
        setup_comm(cluster2)


def test_use_names_what_a_cluster_can_reach(cluster2):
    assert transports.reachable(cluster2) == ("shared memory", "tcp")
    with pytest.raises(ValueError, match="MPI needs engines started with"):
        transports.use(cluster2, "mpi")
    with pytest.raises(ValueError, match=r"transport must be one of \('shared memory', 'tcp'\)"):
        transports.use(cluster2, "udp")


def test_the_panel_runs_on_the_transport_picked(cluster2):
    setup_comm(cluster2)
    panel = CollectivesPanel(link=LinkFit(1e-5, 1e-9), repeats=1, cluster=cluster2,
                             prepare=setup_comm)
    try:
        assert panel.transport.dropdown.options == ("shared memory", "tcp")
        assert panel.transport.dropdown.value == "shared memory"
        panel.size.value = 1 << 12
        panel.transport.dropdown.value = "tcp"
        assert panel.run() is not None, panel.status.value
        assert _in_use(cluster2) == ["tcp", "tcp"]
        panel.transport.dropdown.value = "shared memory"
        assert panel.run() is not None, panel.status.value
        assert _in_use(cluster2) == ["shared memory", "shared memory"]
    finally:
        setup_comm(cluster2)
