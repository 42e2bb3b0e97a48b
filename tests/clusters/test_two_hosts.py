"""Engines on two hosts (network namespaces, tests/clusters/hosts.py): ZmqComm across a
real network boundary, single copy only within a host, local ranks per host, the
hierarchical allreduce on real nodes, preflight, and every notebook unchanged."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attached import assert_notebooks_pass_and_cluster_survives
from hosts import TwoHosts

pytestmark = pytest.mark.cluster
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with TwoHosts(tmp_path_factory.mktemp("hosts"), engines_per_host=2) as running:
        yield running


def on_host_a(hosts, *command, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([*hosts.prefix, *command], capture_output=True, text=True,
                          timeout=timeout)


def test_comm_crosses_hosts_by_tcp_and_shares_memory_within_one(hosts):
    run = on_host_a(hosts, sys.executable, str(HERE / "two_host_checks.py"), str(hosts.client_file))
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    facts = report["facts"]
    assert report["backend"] == "zmq"
    host_of = [f["host"] for f in facts]
    # block placement: each host's engines hold consecutive ranks, whatever order they registered in
    assert host_of in (["hostA", "hostA", "hostB", "hostB"], ["hostB", "hostB", "hostA", "hostA"])
    for f in facts:
        mates = [r for r, h in enumerate(host_of) if h == f["host"]]
        assert (f["local_rank"], f["local_size"]) == (mates.index(f["rank"]), 2)
        # bound on its own host's address, the one that reaches the controller (not loopback)
        assert f["address"].startswith(f"tcp://{hosts.addresses[f['host']]}:")
        # single copy with the engine of its own host, never with the other host
        assert f["single_copy_peers"] == [r for r in mates if r != f["rank"]]
        # shared-memory lanes to itself and its host's other engine; TCP to the other host
        assert f["lane_peers"] == mates
    n_bytes = (1 << 16) * 8
    for rank_result in report["allreduce"]:
        assert rank_result["ring"][0] and rank_result["hierarchical"][0]  # both exact
    ring = sum(r["ring"][1] for r in report["allreduce"])
    hierarchical = sum(r["hierarchical"][1] for r in report["allreduce"])
    # a ring over p=4 ranks on m=2 nodes crosses m links, each carrying 2(p-1)/p of the array;
    # hierarchical sends only the inter-node phase across: 2(m-1) arrays in all
    assert ring == 2 * 2 * 3 / 4 * n_bytes
    assert hierarchical == 2 * (2 - 1) * n_bytes


def test_preflight_sees_two_hosts_and_measures_the_link_between_them(hosts):
    run = on_host_a(hosts, sys.executable, "-m", "coursekit", "preflight", "--cluster",
                    str(hosts.client_file), "--engines", "4", "--nodes", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "inter-host" in run.stdout and "hostA" in run.stdout and "hostB" in run.stdout


def test_every_notebook_runs_on_engines_of_two_hosts(hosts):
    assert_notebooks_pass_and_cluster_survives(hosts.client_file, 4, prefix=tuple(hosts.prefix))
