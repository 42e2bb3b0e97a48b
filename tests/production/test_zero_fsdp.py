"""ZeroRedundancyOptimizer and FSDP2 beside chapter 08's ZeRO: equal step by step, and the
bytes each rank sends equal the formulas (coursekit.production.zero_fsdp's docstring)."""

import numpy as np
import pytest

from coursekit.cluster.runner import ClusterRunner, LocalRunner
from coursekit.comm import setup_comm
from coursekit.nn import MLP
from coursekit.parallel.zero import ShardLayout, state_bytes
from coursekit.production.requirement import INSTALL_HINT, torch_available
from coursekit.production.zero_fsdp import (CHAPTER8, TOLERANCE, ZeroFsdpConfig, fsdp_padded,
                                            zero_experiment)

needs_torch = pytest.mark.skipif(not torch_available(), reason=INSTALL_HINT)

PSI = 64 * 96 + 96 + 96 * 64 + 64 + 64 * 10 + 10  # 13098 parameters
TOL = TOLERANCE  # float64: the two sides sum in different orders (measured: 2.2e-16)


# -- the config and the padding formula, no cluster ---------------------------------------
@pytest.mark.parametrize("kwargs, error, words", [
    (dict(workers=1), ValueError, "workers=1"),
    (dict(workers=2.0), TypeError, "workers must be an integer"),
    (dict(workers=65), ValueError, "workers=65"),
    (dict(steps=0), ValueError, "steps=0"),
    (dict(stage=0), ValueError, "stage=0: must be 1, 2 or 3"),
    (dict(stage=4), ValueError, "stage=4: must be 1, 2 or 3"),
    (dict(stage=True), TypeError, "stage must be an integer"),
    (dict(stage="3"), TypeError, "stage must be an integer"),
    (dict(seed=-1), ValueError, "seed=-1"),
])
def test_config_refuses_bad_values(kwargs, error, words):
    with pytest.raises(error, match=words):
        ZeroFsdpConfig(**kwargs)


def test_experiment_refuses_threads_and_a_config_of_another_type(engines2):
    with pytest.raises(TypeError, match="runner must be a ClusterRunner"):
        zero_experiment(LocalRunner(2), ZeroFsdpConfig(workers=2))
    with pytest.raises(TypeError, match="config must be a ZeroFsdpConfig"):
        zero_experiment(engines2, dict(workers=2))
    with pytest.raises(TypeError, match=r"data must be an \(X, y\) pair"):
        zero_experiment(engines2, ZeroFsdpConfig(workers=2), data=[1, 2])


def test_fsdp_pads_each_parameter_on_its_rows():
    sizes = CHAPTER8["sizes"]
    assert fsdp_padded(sizes, 2) == PSI  # 96, 64 and 10 rows split in 2
    # over 4: the output layer's 10 rows become 12 (weight 12 x 64, bias 12)
    assert fsdp_padded(sizes, 4) == PSI - (64 * 10 + 10) + (12 * 64 + 12)
    assert fsdp_padded(sizes, 3) == (96 * 64 + 96) + (66 * 96 + 66) + (12 * 64 + 12)


# -- on the engines ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engines2(cluster2):
    setup_comm(cluster2, timeout=30)
    return ClusterRunner(cluster2)


@pytest.fixture(scope="module")
def engines4(cluster4):
    setup_comm(cluster4, timeout=30)
    return ClusterRunner(cluster4)


def check(result, p: int) -> None:
    """Equal weights after every step; every rank's bytes in every step equal the formula."""
    stage = result.config.stage
    assert result.max_diff.shape == (result.config.steps,)
    assert (result.max_diff <= TOL).all(), result.max_diff
    # course: ring reduce-scatter + all-gather (stage 3: one more all-gather) of the padded
    # flat buffer, (p-1) chunks of ceil(size_l / p) values per layer and pass
    chunks = sum(-(-n // p) for n in (64 * 96 + 96, 96 * 64 + 64, 64 * 10 + 10))
    passes = 3 if stage == 3 else 2
    assert (result.course_sent == passes * (p - 1) * chunks * 8).all()
    if stage == 1:  # DDP's ring allreduce of Ψ + each parameter broadcast once by its owner
        assert result.torch_owned.sum() == PSI
        np.testing.assert_allclose(result.torch_sent, np.broadcast_to(
            2 * (p - 1) / p * PSI * 8 + (p - 1) * result.torch_owned * 8, result.torch_sent.shape),
            rtol=1e-12)
        assert result.torch_sent[0].sum() == pytest.approx(3 * (p - 1) * PSI * 8)
        assert result.torch_calls == {"allreduce_": 1, "broadcast_": 6}  # W and b of 3 layers
    else:  # all-gather each layer (twice at stage 3), reduce-scatter its gradient
        # each rank updates its rows of every parameter: ceil(rows / p), fewer on the last
        assert result.torch_owned.sum() == PSI
        assert (result.torch_owned <= fsdp_padded(CHAPTER8["sizes"], p) // p).all()
        np.testing.assert_allclose(result.torch_sent, passes * (p - 1) / p
                                   * fsdp_padded(CHAPTER8["sizes"], p) * 8, rtol=1e-12)
        assert result.torch_calls == {"_allgather_base_": 3 * (passes - 1),
                                      "_reduce_scatter_base_": 3}
    assert (result.course_sent == result.course_formula[None, :]).all()
    # what each rank holds after a step (8 bytes a value; momentum: 1 buffer)
    layout = ShardLayout.of(MLP(CHAPTER8["sizes"], dtype=np.float64), p)
    assert all(m == state_bytes(stage, PSI, layout, 8, 1) for m in result.course_memory)
    for owned, held in zip(result.torch_owned, result.torch_memory):
        if stage == 1:  # whole weights and gradients, momentum of the owned parameters only
            assert held == {"params": PSI * 8, "grads": PSI * 8, "optimizer": owned * 8}
        else:           # FSDP: its rows of every parameter, their gradient and momentum
            assert held == {"params": owned * 8, "grads": owned * 8, "optimizer": owned * 8}
    np.testing.assert_allclose(result.torch_sent, np.broadcast_to(
        result.torch_formula, result.torch_sent.shape), rtol=1e-12)  # sums of fractions of n


@needs_torch
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_torch_equals_the_course_on_2_engines(engines2, stage):
    result = zero_experiment(engines2, ZeroFsdpConfig(workers=2, steps=4, stage=stage))
    check(result, 2)
    assert result.padded_course == result.padded_torch == PSI  # 2 divides every width


@needs_torch
@pytest.mark.parametrize("stage", [1, 3])
def test_torch_equals_the_course_on_4_engines_with_padding(engines4, stage):
    result = zero_experiment(engines4, ZeroFsdpConfig(workers=4, steps=3, stage=stage))
    check(result, 4)
    assert result.padded_course == PSI + 2  # 650 values of the last layer: 4 chunks of 163
    assert result.padded_torch == PSI + 130  # its 10 rows: 12 rows of 64 + 1


@needs_torch
def test_a_run_on_fewer_engines_than_the_cluster_has(engines4):
    result = zero_experiment(engines4, ZeroFsdpConfig(workers=3, steps=2, stage=2))
    check(result, 3)


def test_more_workers_than_engines_is_refused(engines2):
    with pytest.raises(ValueError, match="workers=3 but the cluster has 2"):
        zero_experiment(engines2, ZeroFsdpConfig(workers=3, steps=1, stage=1))
