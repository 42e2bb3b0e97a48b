"""The timing experiment returns consistent shapes, and predictions from the model."""

import numpy as np
import pytest

from coursekit import costmodel
from coursekit.collectives.timing import measure_and_predict, time_collective
from coursekit.comm import run_local
from coursekit.runner import LocalRunner


def test_time_collective_per_rank():
    out = run_local(time_collective, 3, "allreduce", "ring", 1024, 4)
    assert len(out) == 3 and all(t.shape == (4,) and (t > 0).all() for t in out)


def test_measure_matches_model_for_predictions():
    res = measure_and_predict(LocalRunner(4), 4, "allgather", "ring", [64, 4096], alpha=1e-5, beta=1e-9,
                  repeats=2)
    assert res.nbytes.tolist() == [64, 4096]
    assert res.measured.shape == (2,) and (res.measured > 0).all()
    np.testing.assert_allclose(res.predicted, costmodel.predict("allgather", "ring", 4,
                                                                res.nbytes, 1e-5, 1e-9))
    np.testing.assert_allclose(res.busbw_measured, res.nbytes / res.measured * 3 / 4)


def test_measure_rejects_unknown_algorithm():
    with pytest.raises(ValueError, match="allowed"):
        measure_and_predict(LocalRunner(2), 2, "bcast", "ring", [64], 1e-5, 1e-9)
