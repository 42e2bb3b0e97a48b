"""Run on host A (inside its network namespace) by test_two_hosts.py: attach to the
two-host cluster named by argv[1] and print, as JSON, what the test asserts on."""

import json
import sys

from ipyparallel import interactive

from coursekit import cluster
from coursekit.comm import call_with_comm, setup_comm


@interactive
def facts(comm):
    from coursekit.cluster import this_engine
    me = this_engine()
    return {"rank": me.rank, "host": me.host, "local_rank": me.local_rank,
            "local_size": me.local_size, "address": comm.addresses[comm.rank],
            "single_copy_peers": sorted(comm.single_copy_peers),
            "lane_peers": sorted(comm.shared_memory_peers)}


@interactive
def allreduces(comm, hosts, n):
    import numpy as np

    from coursekit.collectives import allreduce
    from coursekit.collectives.hierarchical import hierarchical_allreduce

    x = np.arange(n, dtype=np.float64) * (comm.rank + 1)
    expected = np.arange(n, dtype=np.float64) * sum(range(1, comm.size + 1))

    def cross_host_bytes(run):
        comm.trace.clear()
        comm.tracing = True
        try:
            ok = bool(np.array_equal(run(x.copy()), expected))
        finally:
            comm.tracing = False
        sent = [m for m in comm.trace if m.op == "send" and m.src == comm.rank]
        return ok, sum(m.nbytes for m in sent if hosts[m.dst] != hosts[m.src])

    return {"ring": cross_host_bytes(lambda v: allreduce(comm, v, algorithm="ring", check=False)),
            "hierarchical": cross_host_bytes(lambda v: hierarchical_allreduce(comm, v, check=False,
                                                                             nodes=hosts))}


def main(client_file: str) -> None:
    c = cluster.connect(client_file, n=4)
    try:
        backend = setup_comm(c)  # the notebooks' call: no interface given
        seen = c.run(call_with_comm, facts)
        hosts = [f["host"] for f in seen]
        print(json.dumps({"backend": backend, "facts": seen,
                          "allreduce": c.run(call_with_comm, allreduces, hosts, 1 << 16)}))
    finally:
        c.stop()


if __name__ == "__main__":
    main(sys.argv[1])
