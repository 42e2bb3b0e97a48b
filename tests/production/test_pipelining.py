"""torch.distributed.pipelining's GPipe and 1F1B beside chapter 5's executor: equal
gradients and parameters step by step, the same order of actions (GPipe's backwards
reversed), the bytes of the layer split's formula on both sides."""

import numpy as np
import pytest

from coursekit.cluster.runner import ClusterRunner, LocalRunner
from coursekit.comm import setup_comm
from coursekit.data import load_digits
from coursekit.nn import MLP
from coursekit.parallel import traffic
from coursekit.production.pipelining import (RTOL, PipelineConfig, course_order,
                                             pipeline_experiment)


def test_config_is_checked():
    with pytest.raises(ValueError, match="schedule='zb_h1'"):
        PipelineConfig("zb_h1")
    with pytest.raises(ValueError, match="do not split into stages=3"):
        PipelineConfig(stages=3)
    with pytest.raises(ValueError, match="microbatches >= stages"):
        PipelineConfig("1f1b", stages=4, microbatches=2)
    with pytest.raises(ValueError, match="not a multiple of microbatches"):
        PipelineConfig(batch=100, microbatches=8)
    with pytest.raises(TypeError, match="steps must be an integer"):
        PipelineConfig(steps=1.5)
    assert PipelineConfig("gpipe", stages=4, microbatches=2).sizes == (64,) + (512,) * 7 + (10,)


def test_threads_are_refused():
    pytest.importorskip("torch")
    with pytest.raises(TypeError, match="one process per rank"):
        pipeline_experiment(LocalRunner(2), PipelineConfig(stages=2))


def test_course_order_is_the_lecture_schedule():
    # 1F1B: p-1-r warm-up forwards, then alternate; GPipe: all F, then all B last-in first-out
    assert course_order("1f1b", 2, 3) == [["F0", "F1", "B0", "F2", "B1", "B2"],
                                          ["F0", "B0", "F1", "B1", "F2", "B2"]]
    assert course_order("gpipe", 2, 2) == [["F0", "F1", "B1", "B0"]] * 2


@pytest.mark.cluster
@pytest.mark.parametrize("name,stages", [("gpipe", 4), ("1f1b", 4), ("1f1b", 2)])
def test_torch_pipeline_equals_course(cluster4, name, stages):
    pytest.importorskip("torch")
    setup_comm(cluster4, timeout=90)  # a loaded machine: four engines on two cores
    config = PipelineConfig(name, stages=stages, microbatches=4, steps=2, batch=64,
                            hidden=32, lr=0.5)
    r = pipeline_experiment(ClusterRunner(cluster4, timeout=600), config)
    assert r.equal and r.param_error.max() <= RTOL and r.grad_error.max() <= RTOL
    # the first step's loss is the serial model's on the same batch, on both sides
    digits = load_digits(dtype=np.float64)
    serial = MLP(config.sizes, dtype=np.float64, seed=0).loss_and_grad(
        digits.X_train[:64], digits.y_train[:64])[0]
    np.testing.assert_allclose([r.loss[0], r.torch_loss[0]], serial, rtol=1e-12)
    assert r.loss[1] < r.loss[0]
    # both send N x width x 8 bytes across each boundary each way, every step
    formula = traffic.pipeline_bytes(config.sizes, 64, stages)
    assert formula.tolist() == [64 * 32 * 8 * (2 - (k in (0, stages - 1)))
                                for k in range(stages)]
    assert (r.course_bytes == formula).all() and (r.torch_bytes == formula).all()
    # the order each rank ran
    if name == "1f1b":
        assert r.torch_order == r.course_order
    else:
        for torch_ran, course_ran in zip(r.torch_order, r.course_order):
            assert torch_ran[:4] == course_ran[:4] == ["F0", "F1", "F2", "F3"]
            assert torch_ran[4:] == course_ran[4:][::-1] == ["B0", "B1", "B2", "B3"]
    # torch's own description matches what ran, except its 1F1B list for the last rank
    described = r.torch_pipeline_order if name == "gpipe" else r.torch_pipeline_order[:-1]
    assert described == r.torch_order[:len(described)]
    assert r.course_seconds.shape == r.torch_seconds.shape == (2,)
