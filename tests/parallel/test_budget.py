"""Chapter 5: parameter bytes per rank against a memory budget; the strategies that fit run
one step equal to the serial one (ThreadComm ranks)."""

import numpy as np
import pytest

from coursekit.cluster.runner import LocalRunner
from coursekit.data import load_digits
from coursekit.nn import MLP
from coursekit.parallel.budget import (BudgetConfig, MemoryBudgetError, param_bytes,
                                       step_within_budget)

SIZES = [8, 4, 6, 4, 2]  # four layers: 36, 30, 28, 10 parameters


def test_param_bytes_by_hand():
    assert param_bytes(SIZES, "data parallel", 2).tolist() == [8 * 104] * 2
    assert param_bytes(SIZES, "layer split", 2).tolist() == [8 * (36 + 30), 8 * (28 + 10)]
    # column layers 0, 2: (n_in n_out + n_out) / 2; row layers 1, 3: n_in n_out / 2 + n_out
    tensor = (8 * 4 + 4) // 2 + (4 * 6 // 2 + 6) + (6 * 4 + 4) // 2 + (4 * 2 // 2 + 2)
    assert param_bytes(SIZES, "tensor parallel", 2, itemsize=4).tolist() == [4 * tensor] * 2
    with pytest.raises(ValueError, match="strategy='zero': allowed"):
        param_bytes(SIZES, "zero", 2)


@pytest.mark.parametrize("strategy", ["layer split", "tensor parallel"])
def test_a_split_runs_within_the_budget_and_equals_the_serial_step(strategy):
    data = load_digits()
    sizes = [64, 16, 16, 16, 10]  # four layers: they split over 2 ranks both ways
    X, y = data.X_train[:40].astype(np.float64), data.y_train[:40]
    config = BudgetConfig(sizes, strategy, budget_bytes=12_000)
    # 8 bytes x (65 x 16 + 2 x 17 x 16 + 17 x 10) = 14,032 bytes: more than the budget
    with pytest.raises(MemoryBudgetError, match=r"data parallel needs 0.01 MB \(14,032 bytes\) "
                                                r"of parameters on a rank, but the budget is "
                                                r"0.01 MB \(12,000 bytes\) per rank") as refused:
        step_within_budget(LocalRunner(2), BudgetConfig(sizes, "data parallel", 12_000), X, y)
    assert (refused.value.needed, refused.value.budget) == (14_032, 12_000)
    result = step_within_budget(LocalRunner(2), config, X, y)
    loss, grad = MLP(sizes, activation="relu", dtype=np.float64, seed=0).loss_and_grad(X, y)
    assert np.isclose(result.loss, loss) and np.allclose(result.grad, grad)
    assert result.held_bytes.tolist() == param_bytes(sizes, strategy, 2).tolist()
    assert result.held_bytes.max() <= 12_000


def test_data_parallel_runs_when_it_fits():
    data = load_digits()
    X, y = data.X_train[:40].astype(np.float64), data.y_train[:40]
    result = step_within_budget(LocalRunner(2), BudgetConfig([64, 8, 10], "data parallel",
                                                             10**6), X, y)
    loss, grad = MLP([64, 8, 10], activation="relu", dtype=np.float64).loss_and_grad(X, y)
    assert np.isclose(result.loss, loss) and np.allclose(result.grad, grad)
    assert result.held_bytes.tolist() == [8 * (65 * 8 + 9 * 10)] * 2


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(strategy="pipeline"), ValueError, r"strategy='pipeline': allowed"),
    (dict(budget_bytes=0), ValueError, r"budget_bytes=0"),
    (dict(budget_bytes=1.5), TypeError, r"budget_bytes must be an integer"),
])
def test_bad_configs_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        BudgetConfig(**{"sizes": SIZES, "strategy": "layer split", "budget_bytes": 100, **kwargs})
