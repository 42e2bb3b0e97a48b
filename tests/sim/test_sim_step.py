"""coursekit.sim.step: buckets, overlap, FP16, stragglers against hand-computed schedules."""

import numpy as np
import pytest

from coursekit.sim import Network, allreduce_time, resnet50
from coursekit.sim.step import Stragglers, Workload, buckets, scaling, simulate_step

NET = Network(2, 2, 1e-5, 1e-9, 1e-4, 1e-8)
WORK = Workload("toy", grad_bytes=[4e6, 2e6, 1e6, 1e6], backward_s=[0.01, 0.02, 0.01, 0.02],
                forward_s=0.03, update_s=0.005, batch=16)


def test_buckets():
    assert buckets([4, 2, 1, 1], 0).tolist() == [0, 1, 2, 3]
    assert buckets([4, 2, 1, 1], 3).tolist() == [0, 2, 3]
    assert buckets([4, 2, 1, 1], 5).tolist() == [1, 3]
    assert buckets([4, 2, 1, 1], np.inf).tolist() == [3]
    with pytest.raises(ValueError, match="fusion_bytes"):
        buckets([1], -1)


def test_no_fusion_with_overlap_by_hand():
    r = simulate_step(WORK, NET, algorithm="ring", fusion_bytes=0, overlap=True)
    ready = 0.03 + np.cumsum([0.01, 0.02, 0.01, 0.02])
    t = allreduce_time(NET, np.array([4e6, 2e6, 1e6, 1e6]), "ring")
    end = 0.0
    for rd, d in zip(ready, t):
        end = max(rd, end) + d
    assert r.step_s == pytest.approx(max(end, ready[-1]) + 0.005)
    assert r.comm_s == pytest.approx(t.sum())
    assert r.exposed_comm_s == pytest.approx(r.step_s - (ready[-1] + 0.005))


def test_without_overlap_comm_follows_backward():
    r = simulate_step(WORK, NET, fusion_bytes=np.inf, overlap=False)
    t = allreduce_time(NET, 8e6, "ring")
    assert r.step_s == pytest.approx(WORK.compute_s + t)
    assert r.bucket_bytes.tolist() == [8e6]


def test_overlap_never_slower_and_fp16_halves_bytes():
    for fusion in (0, 3e6, np.inf):
        on = simulate_step(WORK, NET, fusion_bytes=fusion, overlap=True)
        off = simulate_step(WORK, NET, fusion_bytes=fusion, overlap=False)
        assert on.step_s <= off.step_s + 1e-15
    half = simulate_step(WORK, NET, fusion_bytes=np.inf, fp16=True, overlap=False)
    assert half.bucket_bytes.tolist() == [4e6]
    assert half.comm_s == pytest.approx(allreduce_time(NET, 4e6, "ring"))


def test_launch_overhead_counts_per_bucket():
    base = simulate_step(WORK, NET, fusion_bytes=0, overlap=False)
    slow = simulate_step(WORK, NET, fusion_bytes=0, overlap=False, launch_s=1e-3)
    assert slow.step_s - base.step_s == pytest.approx(4e-3)


def test_one_worker_is_pure_compute():
    r = simulate_step(WORK, Network(1, 1, 1e-5, 1e-9, 1e-4, 1e-8))
    assert r.step_s == pytest.approx(WORK.compute_s)
    assert r.throughput == pytest.approx(16 / WORK.compute_s)


def test_stragglers_scale_compute_by_the_slowest():
    s = Stragglers(fraction=0.5, slowdown=3.0, seed=1)
    f = s.factors(4)
    assert set(np.round(f, 12)) <= {1.0, 3.0} and f.max() == 3.0
    slow = simulate_step(WORK, NET, stragglers=s, fusion_bytes=np.inf, overlap=False)
    assert slow.compute_s == pytest.approx(3 * WORK.compute_s)
    assert np.array_equal(Stragglers(jitter=0.1, seed=7).factors(5),
                          Stragglers(jitter=0.1, seed=7).factors(5))
    assert Stragglers(jitter=0.1, seed=7).factors(1000).min() >= 1.0


def test_scaling_efficiency_is_one_without_network_cost():
    fast = Network(4, 1, 1e-12, 1e-18, 1e-12, 1e-18)
    res = scaling(WORK, fast, [1, 2, 4], fusion_bytes=np.inf, overlap=False)
    assert res["gpus"].tolist() == [4, 8, 16]
    assert res["efficiency"] == pytest.approx(np.ones(3), abs=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    (dict(grad_bytes=[1.0], backward_s=[0.1, 0.2]), "same non-empty"),
    (dict(grad_bytes=[0.0], backward_s=[0.1]), "grad_bytes must be > 0"),
    (dict(grad_bytes=[1.0], backward_s=[-0.1]), "backward_s must be >= 0"),
    (dict(forward_s=-1.0), "forward_s"),
    (dict(batch=0), "batch"),
])
def test_workload_rejects_bad_input(kwargs, match):
    base = dict(name="w", grad_bytes=[1.0], backward_s=[0.1], forward_s=0.1, update_s=0.0,
                batch=1)
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        Workload(**base)


@pytest.mark.parametrize("kwargs, match", [
    (dict(fraction=1.5), "fraction"), (dict(slowdown=0.5), "slowdown"),
    (dict(jitter=-1.0), "jitter"),
])
def test_stragglers_reject_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Stragglers(**kwargs)


def test_step_rejects_bad_options():
    with pytest.raises(ValueError, match="allowed"):
        simulate_step(WORK, NET, algorithm="star")
    with pytest.raises(ValueError, match="launch_s"):
        simulate_step(WORK, NET, launch_s=-1.0)


def test_fp16_fusion_threshold_applies_to_the_bytes_sent():
    # Horovod fills its fusion buffer with the fp16 tensors: 4 tensors of 2 MB fp32 = 1 MB fp16
    # each; a 2 MB threshold packs two fp16 tensors per bucket (fp32 would give one per bucket)
    work = Workload("four", [2e6] * 4, [1e-3] * 4, 1e-3, 0.0, 8)
    fp32 = simulate_step(work, NET, fusion_bytes=2e6)
    fp16 = simulate_step(work, NET, fusion_bytes=2e6, fp16=True)
    assert fp32.bucket_bytes.tolist() == [2e6] * 4
    assert fp16.bucket_bytes.tolist() == [2e6, 2e6]  # two 1 MB fp16 tensors each
    resnet = resnet50.workload(batch=64)
    big = simulate_step(resnet, resnet50.case_study_network(nodes=128), fusion_bytes=64 * 2**20,
                        fp16=True, algorithm="hierarchical")
    assert big.bucket_bytes.sum() == pytest.approx(resnet.grad_bytes.sum() / 2)
    assert big.bucket_bytes.size == 1  # 48.8 MiB of fp16 never fills a 64 MiB buffer
