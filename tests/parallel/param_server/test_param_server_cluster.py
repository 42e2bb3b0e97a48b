"""Chapter 4 on a real local cluster: a worker engine's process is killed mid-run (SIGKILL)."""

import numpy as np
import pytest

from coursekit.comm import setup_comm
from coursekit.parallel.param_server import PSConfig, train
from coursekit.cluster.runner import ClusterRunner

pytestmark = pytest.mark.cluster


def test_killing_a_worker_engine_leaves_an_asp_run_to_the_others():
    from coursekit import cluster
    with cluster.start(n=4) as c:
        setup_comm(c, timeout=20)
        engines = ClusterRunner(c, timeout=60)
        ok = train(engines, PSConfig(model="ssp", staleness=1, steps=20), workers=3)
        assert ok.applied == 60 and ok.lost == [] and ok.staleness.max() <= 1
        cfg = PSConfig(model="asp", steps=60, crash={1: 25}, crash_kills=True,
                       worker_timeout=1.0, straggler={0: 0.002, 2: 0.002})
        result = train(engines, cfg, workers=3)
    assert result.workers[1] is None  # its process is gone: no report
    assert [result.workers[w].status for w in (0, 2)] == ["finished", "finished"]
    (lost,) = result.lost
    assert lost["worker"] == 1 and lost["clock"] == 25 and lost["t"] >= 1.0
    assert result.applied == 2 * 60 + 25
    assert np.isnan(result.idle_s[1]) and np.isfinite(result.idle_s[[0, 2]]).all()
