"""One device switch for chapters 3 and 6: ``DPConfig(device=...)`` and
``CompressionConfig(device=...)``, checked up front; on "cpu" nothing changes. The GPU runs
themselves (== the CPU's, with "stage" spans) are in test_data_parallel_cuda_sim.py, run
here in numba's CUDA simulator in a process of its own.
"""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cudasim import run_in_simulator

from coursekit.cluster.runner import LocalRunner, RankFailure
from coursekit.parallel.compression.experiment import CompressionConfig
from coursekit.parallel.data_parallel import DPConfig, train
from coursekit.parallel.data_parallel.experiments import Scaling
from coursekit.parallel.data_parallel.results import StepBreakdown

SIM_TESTS = Path(__file__).with_name("test_data_parallel_cuda_sim.py")
RANKS = LocalRunner(2)
ALLOWED = r"device=.* is not supported; allowed: cpu, cuda, auto"


def _no_gpu() -> bool:
    from numba import cuda

    return not cuda.is_available()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    return rng.standard_normal((24, 4)), rng.integers(0, 3, 24)


@pytest.mark.parametrize("value", ["gpu", "CUDA", "", None, 0, ("cuda",)])
@pytest.mark.parametrize("make", [lambda v: DPConfig(device=v),
                                  lambda v: CompressionConfig(device=v)],
                         ids=["DPConfig", "CompressionConfig"])
def test_a_bad_device_is_refused_with_the_allowed_ones(make, value):
    with pytest.raises(ValueError, match=ALLOWED):
        make(value)


def test_the_overlapped_backward_refuses_cuda_and_computes_on_the_cpu_with_auto():
    with pytest.raises(ValueError, match=r"device='cuda' cannot overlap .* NumPy on the host; "
                                         r"use overlap=False"):
        DPConfig(device="cuda", bucket_bytes=1024)
    assert DPConfig(device="cuda", bucket_bytes=1024, overlap=False).worker_device == "cuda"
    assert DPConfig(device="auto", bucket_bytes=1024).worker_device == "cpu"
    assert DPConfig(device="auto").worker_device == "auto"


def test_the_device_is_not_part_of_the_runs_fingerprint():
    """A checkpoint of a CPU run resumes on GPUs: the same model, the same trajectory."""
    cfg = DPConfig()
    assert replace(cfg, device="cuda").fingerprint(2, "d") == cfg.fingerprint(2, "d")


def test_a_cpu_run_stages_nothing_and_says_where_it_computed(data):
    cfg = DPConfig(sizes=(4, 5, 3), batch_size=6, max_steps=3, publish_interval=0.0)
    r = train(RANKS, cfg, data)
    assert r.devices == ["cpu", "cpu"] and r.stage_s is None
    assert not any(s.kind == "stage" for s in r.spans)
    parts = r.step_breakdown()
    assert parts.stage == 0 and "stage" not in str(parts) and r.stage_per_step == 0


@pytest.mark.skipif(not _no_gpu(), reason="this machine has a GPU")
def test_without_a_gpu_auto_computes_on_the_cpu_and_cuda_names_the_alternatives(data):
    cfg = DPConfig(sizes=(4, 5, 3), batch_size=6, max_steps=1, publish_interval=0.0)
    assert train(RANKS, replace(cfg, device="auto"), data).devices == ["cpu", "cpu"]
    with pytest.raises(RankFailure, match="device='cuda' but numba finds no usable CUDA GPU; "
                                          "use device='cpu' or device='auto'"):
        train(RANKS, replace(cfg, device="cuda"), data, timeout=60)


def test_the_step_is_compute_plus_stage_plus_communication_plus_other(data):
    r = train(RANKS, DPConfig(sizes=(4, 5, 3), batch_size=6, max_steps=1, publish_interval=0.0),
              data)
    # hand-made: rank 0 computes 5, stages 0.5, exchanges 0.5; rank 1 computes 1, stages 2,
    # waits 3.5; the slowest work is rank 0's 5.5 = compute 5 + stage 0.5
    fake = replace(r, step_s=np.array([[6.0], [6.5]]), compute_s=np.array([[5.0], [1.0]]),
                   stage_s=np.array([[0.5], [2.0]]), devices=["cuda", "cuda"])
    assert fake.step_breakdown() == StepBreakdown(6.5, 5.0, 0.5, 0.5, stage=0.5)
    assert (fake.stage_per_step, fake.comm_per_step) == (0.5, 0.5)
    assert "+ stage 500.00 (host <-> GPU copies) +" in str(fake.step_breakdown())


def test_the_scaling_model_adds_the_one_worker_staging():
    s = Scaling(workers=np.array([1, 2]), step=np.array([4.0, 5.0]), compute=np.array([2.0, 2.1]),
                stage=np.array([1.0, 1.1]), comm=np.array([0.0, 1.5]),
                predicted_comm=np.array([0.0, 1.0]))
    np.testing.assert_allclose(s.predicted_step, [3.0, 4.0])  # 2 + 1 + t_comm(N)
    np.testing.assert_allclose(s.predicted_efficiency, [1.0, 0.75])


@pytest.mark.slow  # a pytest process of its own; the simulator runs every GPU thread in Python
def test_data_parallel_and_compression_on_the_gpu_equal_the_cpu_in_the_simulator():
    run_in_simulator(SIM_TESTS, timeout=180)
