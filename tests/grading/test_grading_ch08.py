"""The chapter-8 check passes ZeRO-2's step and fails plausible wrong answers."""

import numpy as np

from coursekit.collectives import allgather, allreduce, reduce_scatter
from coursekit.grading.ch08 import check_zero2_step


def gathered_weights(comm, shard, layout, like):
    params = np.empty_like(like)
    layout.flat_into(allgather(comm, shard).reshape(comm.size, layout.width), params)
    return params


def zero2_step(comm, grad, shard, optimizer, layout):
    optimizer.step(reduce_scatter(comm, layout.rows(grad))[0])
    return gathered_weights(comm, shard, layout, grad)


def test_accepts_reduce_scatter_update_allgather():
    result = check_zero2_step(zero2_step, quiet=True)
    assert result, result.message


def test_rejects_an_allreduce_then_allgather_by_its_bytes():
    def via_allreduce(comm, grad, shard, optimizer, layout):
        optimizer.step(allreduce(comm, layout.rows(grad))[comm.rank])
        return gathered_weights(comm, shard, layout, grad)
    result = check_zero2_step(via_allreduce, quiet=True)
    assert result.status == "fail" and "1.5 x that" in result.message


def test_rejects_a_step_without_the_sum():
    def local_only(comm, grad, shard, optimizer, layout):
        optimizer.step(layout.rows(grad)[comm.rank])  # my shard of my own gradient only
        return gathered_weights(comm, shard, layout, grad)
    result = check_zero2_step(local_only, quiet=True)
    assert result.status == "fail" and "differ from serial training" in result.message


def test_rejects_a_wrong_return_value():
    def shard_only(comm, grad, shard, optimizer, layout):
        optimizer.step(reduce_scatter(comm, layout.rows(grad))[0])
        return shard
    result = check_zero2_step(shard_only, quiet=True)
    assert result.status == "fail" and "whole flat weights" in result.message


def test_a_stub_is_todo():
    def stub(comm, grad, shard, optimizer, layout):
        raise NotImplementedError
    assert check_zero2_step(stub, quiet=True).status == "todo"
