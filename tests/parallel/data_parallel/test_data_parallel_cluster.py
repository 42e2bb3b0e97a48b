"""Data-parallel training on a real 3-engine cluster: ZmqComm between engines, the data
memory-mapped from one packed file, live updates, a subset of engines, a dead engine."""

from dataclasses import replace

import numpy as np
import pytest

from coursekit.data import load_digits
from coursekit.datafile import pack
from coursekit.nn import MLP, train
from coursekit.parallel import data_parallel
from coursekit.parallel.data_parallel import DPConfig
from coursekit.cluster.runner import ClusterRunner, RankFailure

pytestmark = pytest.mark.cluster


def test_training_on_engines_equals_serial_and_a_dead_engine_is_named(tmp_path):
    from coursekit import cluster
    from coursekit.comm import setup_comm

    d = load_digits(dtype=np.float64)
    packed = pack(d.X_train[:240], d.y_train[:240], tmp_path / "digits.pack")
    cfg = DPConfig(sizes=(64, 16, 10), dtype="float64", batch_size=30, epochs=1, lr=0.1,
                   momentum=0.9, seed=5, publish_interval=0.0)
    serial = MLP(cfg.sizes, dtype=np.float64, seed=5)
    train(serial, d.X_train[:240], d.y_train[:240], epochs=1, batch_size=30, lr=0.1,
          momentum=0.9, seed=5)
    with cluster.start(n=3) as c:
        setup_comm(c, timeout=3)
        engines = ClusterRunner(c, timeout=60)
        updates = []
        got = data_parallel.train(engines, cfg, packed, (d.X_test, d.y_test),
                                  on_update=updates.append)
        np.testing.assert_allclose(got.params, serial.params, rtol=1e-10, atol=1e-12)
        assert [u["step"] for u in updates[-1]] == [8, 8, 8]  # live data from every engine
        assert len(updates[-1][0]["loss"]) == 8
        ps = data_parallel.train(engines, replace(cfg, exchange="ps", bucket_bytes=None), packed)
        np.testing.assert_allclose(ps.params, serial.params, rtol=1e-10, atol=1e-12)
        two = data_parallel.train(engines, replace(cfg, bucket_bytes=2048), packed, workers=2)
        assert two.n_workers == 2
        np.testing.assert_allclose(two.params, serial.params, rtol=1e-10, atol=1e-12)
        with pytest.raises(RankFailure, match=r"train_worker failed on rank 1:") as lost:
            data_parallel.train(engines, replace(cfg, crash_rank=1, crash_step=2), packed,
                                timeout=30)
        assert lost.value.ranks == [1]
        # the survivors waiting on rank 1 learned at once, through their shared-memory
        # lanes, that its process had ended (PeerGone), instead of at their 3 s timeout
        assert "stopped waiting for rank 1" in str(lost.value), str(lost.value)
        assert "its process has exited" in str(lost.value), str(lost.value)
