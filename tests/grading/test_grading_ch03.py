"""The chapter-3 check passes the solution and fails the usual mistakes with a hint."""

import numpy as np

from coursekit.collectives import allreduce
from coursekit.grading.ch03 import check_data_parallel_step


def make_step(weighting="share", communicate=True):
    def dp_step(comm, mlp, X, y, batch_size, lr):
        loss, grad = mlp.loss_and_grad(X, y)
        w = {"share": len(X) / batch_size, "one": 1.0, "mean": 1.0 / comm.size}[weighting]
        total = allreduce(comm, grad * w) if communicate else grad * w
        mlp.params[...] -= lr * total
        return loss
    return dp_step


def test_the_solution_passes():
    result = check_data_parallel_step(make_step(), quiet=True)
    assert result, result.message


def test_summing_without_weights_fails_with_a_hint():
    result = check_data_parallel_step(make_step("one"), quiet=True)
    assert not result and "summed the gradients without dividing" in result.message


def test_one_over_p_fails_on_uneven_shards():
    result = check_data_parallel_step(make_step("mean"), quiet=True)
    assert not result and "averaged with 1/p" in result.message
    assert "p=3 ranks with a global batch of 10" in result.message  # even shards passed


def test_no_communication_fails():
    result = check_data_parallel_step(make_step(communicate=False), quiet=True)
    assert not result and "sent and received no message" in result.message


def test_ranks_that_disagree_fail():
    def lopsided(comm, mlp, X, y, batch_size, lr):
        loss = make_step()(comm, mlp, X, y, batch_size, lr)
        if comm.rank == 1:
            mlp.params[0] += 1.0
        return loss
    result = check_data_parallel_step(lopsided, quiet=True)
    assert not result and "rank 1 ended with parameters different from rank 0's" in result.message


def test_the_stub_says_todo():
    def stub(comm, mlp, X, y, batch_size, lr):
        raise NotImplementedError("write the step")
    assert check_data_parallel_step(stub, quiet=True).status == "todo"


def test_a_crashing_student_function_is_reported_plainly():
    def broken(comm, mlp, X, y, batch_size, lr):
        return np.linalg.inv(np.zeros((2, 2)))
    result = check_data_parallel_step(broken, quiet=True)
    assert not result and "your function raised LinAlgError" in result.message
