"""The chapter-6 check passes top-k with error feedback and fails plausible wrong answers."""

import numpy as np

from coursekit.collectives import allgather, allreduce
from coursekit.grading.ch06 import check_topk_error_feedback


def topk_ef(comm, grad, residual, ratio, index_dtype=np.int32, accumulate=True):
    x = grad + residual
    k = max(1, round(ratio * x.size))
    idx = np.argpartition(np.abs(x), x.size - k)[x.size - k:].astype(index_dtype)
    new_residual = x.copy()
    new_residual[idx] = 0
    all_idx = allgather(comm, idx, check=False)
    all_values = allgather(comm, x[idx], check=False)
    mean = np.zeros_like(x)
    if accumulate:
        np.add.at(mean, all_idx, all_values)
    else:
        mean[all_idx] += all_values  # repeated indices keep only one value
    return mean / comm.size, new_residual


def test_accepts_top_k_with_error_feedback():
    result = check_topk_error_feedback(topk_ef, quiet=True)
    assert result, result.message


def test_rejects_a_forgotten_residual():
    def no_ef(comm, grad, residual, ratio):
        mean, _ = topk_ef(comm, grad, np.zeros_like(residual), ratio)
        return mean, np.zeros_like(grad)
    result = check_topk_error_feedback(no_ef, quiet=True)
    assert result.status == "fail"
    assert "new residual keeps exactly what was not sent" in result.message


def test_rejects_lost_values_at_repeated_indices():
    result = check_topk_error_feedback(
        lambda *a: topk_ef(*a, accumulate=False), quiet=True)
    assert result.status == "fail" and "np.add.at" in result.message


def test_rejects_too_many_bytes():
    result = check_topk_error_feedback(lambda *a: topk_ef(*a, index_dtype=np.int64), quiet=True)
    assert result.status == "fail" and "int32 indices" in result.message

    def dense(comm, grad, residual, ratio):  # sends everything, keeps the residual right
        mean, new_residual = topk_ef(comm, grad, residual, ratio)
        allreduce(comm, grad, check=False)
        return mean, new_residual
    result = check_topk_error_feedback(dense, quiet=True)
    assert result.status == "fail" and "bytes" in result.message


def test_rejects_what_does_not_converge():
    def broken_on_big_models(comm, grad, residual, ratio):
        mean, new_residual = topk_ef(comm, grad, residual, ratio)
        return (np.zeros_like(mean) if grad.size > 1000 else mean), new_residual
    result = check_topk_error_feedback(broken_on_big_models, quiet=True)
    assert result.status == "fail" and "within 1 percentage point" in result.message


def test_stub_is_todo_and_bad_returns_fail():
    def stub(comm, grad, residual, ratio):
        raise NotImplementedError
    assert check_topk_error_feedback(stub, quiet=True).status == "todo"
    result = check_topk_error_feedback(lambda *a: None, quiet=True)
    assert result.status == "fail" and "must return two arrays" in result.message
