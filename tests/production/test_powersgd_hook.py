"""DDP's powerSGD_hook beside chapter 6's PowerSGD: with the course's initial Q copied in,
the parameters agree step by step; the mean residual agrees, the workers' own do not;
both hand the formula's bytes to allreduce."""

import numpy as np
import pytest

from coursekit.cluster.runner import ClusterRunner, LocalRunner
from coursekit.comm import setup_comm
from coursekit.costmodel import traffic
from coursekit.production.powersgd_hook import (RTOL, PowerSGDConfig, payload_bytes,
                                                powersgd_experiment)


def test_config_is_checked():
    with pytest.raises(ValueError, match="start_iter=1"):
        PowerSGDConfig(start_iter=1)
    with pytest.raises(ValueError, match="start_iter=20"):
        PowerSGDConfig(start_iter=20, steps=20)
    with pytest.raises(ValueError, match="rank <= 8"):  # the 64 x 10 matrix: 74 r < 640
        PowerSGDConfig(rank=9)
    with pytest.raises(TypeError, match="error_feedback"):
        PowerSGDConfig(error_feedback="yes")
    assert PowerSGDConfig(rank=8).max_rank == 8


def test_payload_formula():
    config = PowerSGDConfig(rank=2, hidden=64)  # 64 x 64 and 64 x 10 matrices, 74 biases
    assert payload_bytes(config) == 8 * ((64 + 64) * 2 + (64 + 10) * 2 + 74) == 3824
    assert payload_bytes(config, compressed=False) == 8 * (64 * 64 + 64 * 10 + 74)


def test_threads_are_refused():
    pytest.importorskip("torch")
    with pytest.raises(TypeError, match="one process per rank"):
        powersgd_experiment(LocalRunner(2), PowerSGDConfig(workers=2))


@pytest.mark.cluster
@pytest.mark.parametrize("workers,rank,error_feedback", [(4, 2, True), (2, 3, False)])
def test_hook_equals_course(cluster4, workers, rank, error_feedback):
    pytest.importorskip("torch")
    setup_comm(cluster4, timeout=90)  # a loaded machine: four engines on two cores
    config = PowerSGDConfig(workers=workers, rank=rank, error_feedback=error_feedback,
                            start_iter=2, steps=6, hidden=32)
    r = powersgd_experiment(ClusterRunner(cluster4, timeout=600), config)
    assert r.param_error.max() <= RTOL
    np.testing.assert_allclose(r.torch_loss, r.loss, rtol=1e-9)
    assert r.accuracy == r.torch_accuracy
    if error_feedback:  # torch keeps x_w - C, the course x_w - P^ Q_w^T: equal means only
        assert r.residual_mean_error <= 1e-9 < 1e-3 < r.residual_worker_error
    # bytes handed to allreduce: dense for 2 steps, then the PowerSGD payload
    dense, low = payload_bytes(config, compressed=False), payload_bytes(config)
    expected = [dense] * 2 + [low] * 4
    assert r.course_payload.tolist() == r.torch_payload.tolist() == expected
    assert r.torch_allreduces.tolist() == [1] * 2 + [3] * 4  # biases, Ps, Qs
    # the course's ring sends 2(p-1)/p of it (its chunks), per round, counted by the trace
    rounds = [[dense]] * 2 + [[8 * (64 + 32) * rank + 8 * 42, 8 * (32 + 10) * rank]] * 4
    for step, sizes in enumerate(rounds):
        for w in range(workers):
            want = sum(traffic("allreduce", "ring", workers, n, itemsize=8).nbytes[w] for n in sizes)
            assert r.course_wire[step, w] == want
    assert np.allclose(r.course_wire.sum(axis=1), workers * r.ring_wire, rtol=0.01)


def test_batch_must_fit_the_digits():
    with pytest.raises(ValueError, match="batch_size=400"):
        PowerSGDConfig(workers=4, batch_size=400)
