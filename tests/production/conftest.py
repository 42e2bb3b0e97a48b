"""The torch comparisons run on clusters of their own, one per test module, not on the run's
shared ``cluster2`` / ``cluster4`` (same names, so the tests read the same).

torch's C++ objects (DDP's reducer, gloo's threads, pipeline stages) live in the engines'
processes: one that ends an engine when it is freed at the wrong moment must fail the
module that did it, not every later test on a shared cluster. So each module's clusters
are checked when the module ends: every engine still registered, and answering.
"""

import os
import time

import pytest

from coursekit import cluster as course_cluster


def _engines_output(c) -> str:
    """What the engines printed (a crash's last words: run with PYTHONFAULTHANDLER=1 for a
    segfault's traceback), the end of each."""
    sections = [part for launcher in c.ipp_cluster.engines.values()
                for part in launcher.get_output().split("Output for engine ") if part.strip()]
    return "\n".join(f"--- engine {part[:1500]}" + (f"\n...\n{part[-2500:]}" if len(part) > 4000
                                                     else part[1500:]) for part in sections)


def _own_cluster(n: int):
    c = course_cluster.start(n=n)
    try:
        yield c
        deadline = time.monotonic() + 3.0  # an engine's nanny tells the controller it died
        while time.monotonic() < deadline and len(c.client.ids) == n:
            time.sleep(0.2)
        assert len(c.client.ids) == n, (f"an engine of this module's {n}-engine cluster died: "
                                        f"{len(c.client.ids)} left (ids {c.client.ids}); "
                                        f"the engines' output:\n{_engines_output(c)}")
        assert len(set(c.run(os.getpid, timeout=60))) == n  # and every one still answers
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
