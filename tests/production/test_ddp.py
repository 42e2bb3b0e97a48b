"""DDP beside chapter 3's synchronous allreduce SGD (coursekit.production.ddp): equal
parameters step by step, DDP's buckets against its rule and the course's, bytes against
the ring formula, the config's checks."""

import numpy as np
import pytest

from coursekit import costmodel
from coursekit.comm import setup_comm
from coursekit.cluster.runner import ClusterRunner, LocalRunner
from coursekit.production.ddp import (TOLERANCE, DDPConfig, ddp_bucket_plan, ddp_experiment, ring_bytes,
                                      serial_reference)

pytest.importorskip("torch")

SIZES = (64, 256, 256, 10)
TOL = TOLERANCE  # float64: the two sides reduce in different orders


@pytest.fixture(scope="module")
def runs(cluster4, digits_f64):
    setup_comm(cluster4, timeout=30)
    runner = ClusterRunner(cluster4)
    data = (digits_f64.X_train, digits_f64.y_train)
    return {(p, cap): ddp_experiment(runner, DDPConfig(sizes=SIZES, steps=4, bucket_cap_mb=cap),
                                     data, workers=p, timeout=300)
            for p in (2, 4) for cap in (0.1, 25.0)}


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("cap", [0.1, 25.0])
def test_ddp_equals_the_course_and_serial_sgd_after_every_step(runs, p, cap):
    r = runs[p, cap]
    assert r.workers == p and r.ddp_params.shape == (4, r.n_params)
    assert (r.max_diff <= TOL).all(), r.max_diff
    assert (r.max_diff_serial <= TOL).all(), r.max_diff_serial
    assert np.abs(r.course_params - r.serial_params).max() <= TOL
    assert np.abs(np.diff(r.ddp_params, axis=0)).max() > 1e-3  # the steps did move the weights


@pytest.mark.parametrize("cap", [0.1, 25.0])
def test_ddp_buckets_follow_its_rule_and_cover_what_the_course_buckets_cover(runs, cap):
    r = runs[4, cap]
    first = r.buckets_at(0)
    assert [b.names for b in first] == [("W1", "b1", "W2", "b2", "W3", "b3")]  # before the rebuild
    plan = ddp_bucket_plan(SIZES, cap)
    for step in range(1, 4):
        assert [b.names for b in r.buckets_at(step)] == plan
        assert [b.index for b in r.buckets_at(step)] == list(range(len(plan)))
    for step in range(4):
        assert sum(b.numel for b in r.buckets_at(step)) == r.n_params
    cap_bytes = DDPConfig(bucket_cap_mb=cap).bucket_bytes
    ddp_bytes = [b.numel * 8 for b in r.buckets_at(1)]
    assert all(n >= cap_bytes for n in ddp_bytes[:-1])  # whole tensors, closed at >= cap
    course = [(hi - lo) * 8 for lo, hi in r.course_buckets]
    assert all(n <= cap_bytes for n in course) and sum(course) == r.n_params * 8
    assert r.course_buckets[0][1] == r.n_params  # both start from the end (the last layer)
    assert len(course) == -(-r.n_params * 8 // cap_bytes) >= len(ddp_bytes)


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("cap", [0.1, 25.0])
def test_bytes_per_rank_per_step_equal_the_ring_formula(runs, p, cap):
    r = runs[p, cap]
    formula = 2 * (p - 1) / p * r.n_params * 8
    assert r.bytes_formula == formula
    np.testing.assert_allclose(r.ddp_sent, formula, rtol=1e-12)
    exact = sum(costmodel.traffic("allreduce", "ring", p, (hi - lo) * 8, itemsize=8).nbytes
                for lo, hi in r.course_buckets)
    np.testing.assert_array_equal(r.course_sent, exact)  # the trace, message by message
    assert r.course_sent.mean() == pytest.approx(formula, rel=1e-12)


def test_times_are_measured(runs):
    r = runs[4, 0.1]
    assert r.course_step_s.shape == r.ddp_step_s.shape == (4, 4)
    assert (r.course_step_s > 0).all() and (r.ddp_step_s > 0).all()
    assert all(t > 0 for t in r.time_per_step)


def test_plan_and_formula_by_hand():
    assert ddp_bucket_plan((4, 3, 2), 25) == [("b2", "W2", "b1", "W1")]
    # b2 + W2 = 8 elements = 64 bytes >= a 60-byte cap; then b1 + W1 = 15 elements
    assert ddp_bucket_plan((4, 3, 2), 60 / 2**20) == [("b2", "W2"), ("b1", "W1")]
    assert ring_bytes(100, 4) == 2 * 3 / 4 * 100 * 8
    assert ring_bytes([10, 30], 2) == 320


def test_serial_reference_is_serial_sgd(digits_f64):
    from coursekit.nn import MLP, train
    cfg = DDPConfig(sizes=(64, 8, 10), steps=3, batch_size=449, momentum=0.5)
    X, y = digits_f64.X_train[:1347], digits_f64.y_train[:1347]
    mlp = MLP(cfg.sizes, dtype=np.float64, seed=0)
    train(mlp, X, y, epochs=1, batch_size=449, lr=cfg.lr, momentum=0.5, seed=0)
    np.testing.assert_allclose(serial_reference(cfg, X, y)[-1], mlp.params, rtol=0, atol=1e-14)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(steps=0), ValueError, "steps"),
    (dict(steps=2.0), TypeError, "steps"),
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(bucket_cap_mb=0), ValueError, "bucket_cap_mb"),
    (dict(bucket_cap_mb="25"), TypeError, "bucket_cap_mb"),
    (dict(lr=-1.0), ValueError, "lr"),
    (dict(momentum=1.0), ValueError, "momentum"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(sizes=(64,)), ValueError, "sizes"),
])
def test_config_is_checked(kwargs, error, words):
    with pytest.raises(error, match=words):
        DDPConfig(**kwargs)


def test_the_experiment_refuses_threads_and_uneven_shards(digits_f64):
    data = (digits_f64.X_train, digits_f64.y_train)
    with pytest.raises(TypeError, match="ClusterRunner"):
        ddp_experiment(LocalRunner(2), DDPConfig(), data)
    with pytest.raises(ValueError, match="multiple of workers=3"):
        DDPConfig(batch_size=64).check_workers(3, 1000)
    with pytest.raises(ValueError, match="at most 15 steps"):
        DDPConfig(steps=16, batch_size=64).check_workers(2, 1000)


# ---- porting chapter 3's script to DDP (coursekit.production.porting) ----

def test_the_ported_script_trains_like_the_chapter3_script(cluster4, digits_f64):
    from coursekit.production import porting
    setup_comm(cluster4, timeout=30)
    runner = ClusterRunner(cluster4)
    X, y = digits_f64.X_train, digits_f64.y_train
    by_hand = runner.run(porting.run_script, porting.CHAPTER3_SCRIPT, X, y, timeout=300)
    ported = runner.run(porting.run_script, porting.DDP_SCRIPT, X, y, timeout=300)
    serial = serial_reference(DDPConfig(sizes=(64, 32, 10), steps=5), X, y)[-1]
    assert np.abs(ported[0] - by_hand[0]).max() <= TOL
    assert np.abs(ported[0] - serial).max() <= TOL
    assert all(np.array_equal(p, ported[0]) for p in ported)


def test_the_port_diff_is_small_and_names_what_changed():
    from coursekit.production import porting
    diff = porting.port_diff()
    changed = [l for l in diff.splitlines() if l[:1] in "+-" and l[:3] not in ("+++", "---")]
    assert len(changed) <= 16, diff
    assert any(l.startswith('+dist.init_process_group("gloo")') for l in changed)
    assert any(l.startswith("+dist.destroy_process_group()") for l in changed)
    assert any(l.startswith("-") and "allreduce(comm" in l for l in changed)
    assert any(l.startswith("+") and "DDP(" in l for l in changed)
