"""The torch comparisons run on clusters of their own, one per test module, not on the run's
shared ``cluster2`` / ``cluster4`` (same names, so the tests read the same).

torch's C++ objects (DDP's reducer, gloo's threads, pipeline stages) live in the engines'
processes: one that ends an engine when it is freed at the wrong moment must fail the
module that did it, not every later test on a shared cluster. So each module's clusters
are checked when the module ends: every engine still registered.
"""

import time

import pytest

from coursekit import cluster as course_cluster


def _own_cluster(n: int):
    c = course_cluster.start(n=n)
    try:
        yield c
        deadline = time.monotonic() + 3.0  # the controller notices a dead engine by heartbeat
        while time.monotonic() < deadline and len(c.client.ids) == n:
            time.sleep(0.2)
        assert len(c.client.ids) == n, (f"an engine of this module's {n}-engine cluster died: "
                                        f"{len(c.client.ids)} left (ids {c.client.ids})")
    finally:
        c.stop()


@pytest.fixture(scope="module")
def cluster2():
    """2 engines for this module alone, checked alive when it ends."""
    yield from _own_cluster(2)


@pytest.fixture(scope="module")
def cluster4():
    """4 engines for this module alone, checked alive when it ends."""
    yield from _own_cluster(4)
