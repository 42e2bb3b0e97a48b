"""The chapter-8 check passes ZeRO-2's bucketed step and fails plausible wrong answers."""

import numpy as np

from coursekit.collectives import allgather, allreduce, reduce_scatter
from coursekit.grading.ch08 import check_zero2_step


def gathered_weights(comm, shard, layout):
    params = np.empty(layout.spans[-1].stop, shard.dtype)
    layout.flat_into(allgather(comm, shard).reshape(comm.size, layout.width), params)
    return params


def zero2_step(comm, backward, shard, optimizer, layout):
    grad_shard = np.empty(layout.width)
    for l, block in backward:
        grad_shard[layout.offsets[l]:layout.offsets[l + 1]] = reduce_scatter(comm, layout.padded(l, block))[0]
    optimizer.step(grad_shard)
    return gathered_weights(comm, shard, layout)


def test_accepts_a_reduce_scatter_per_bucket():
    result = check_zero2_step(zero2_step, quiet=True)
    assert result, result.message
    assert "peak gradient held" in result.message


def test_rejects_zero1_which_waits_for_the_whole_gradient():
    def zero1(comm, backward, shard, optimizer, layout):
        blocks = dict(backward)  # the whole gradient first, then one reduce-scatter
        grad = np.concatenate([blocks[l] for l in sorted(blocks)])
        optimizer.step(reduce_scatter(comm, layout.rows(grad))[0])
        return gathered_weights(comm, shard, layout)
    result = check_zero2_step(zero1, quiet=True)
    assert result.status == "fail" and "before asking for the next" in result.message


def step_with(shard_of_block):
    """A student's ZeRO-2 step whose only choice is how a gradient block becomes this rank's
    shard of it: ``shard_of_block(comm, layout, l, block)``."""
    def step(comm, backward, shard, optimizer, layout):
        grad_shard = np.empty(layout.width)
        for l, block in backward:
            grad_shard[layout.offsets[l]:layout.offsets[l + 1]] = shard_of_block(comm, layout, l, block)
        optimizer.step(grad_shard)
        return gathered_weights(comm, shard, layout)
    return step


def test_rejects_keeping_the_blocks():
    kept = []

    def keep(comm, layout, l, block):
        kept.append(block)  # reduce-scattered in time, but never freed
        return reduce_scatter(comm, layout.padded(l, block))[0]
    result = check_zero2_step(step_with(keep), quiet=True)
    assert result.status == "fail" and "still held" in result.message


def test_rejects_an_allreduce_per_bucket_by_its_bytes():
    def via_allreduce(comm, layout, l, block):
        return allreduce(comm, layout.padded(l, block))[comm.rank]
    result = check_zero2_step(step_with(via_allreduce), quiet=True)
    assert result.status == "fail" and "sent" in result.message


def test_rejects_a_step_without_the_sum():
    def local_only(comm, layout, l, block):
        reduce_scatter(comm, layout.padded(l, block))
        return layout.padded(l, block)[comm.rank]
    result = check_zero2_step(step_with(local_only), quiet=True)
    assert result.status == "fail" and "differ from serial training" in result.message


def test_rejects_a_wrong_return_value():
    def shard_only(comm, backward, shard, optimizer, layout):
        zero2_step(comm, backward, shard, optimizer, layout)
        return shard
    result = check_zero2_step(shard_only, quiet=True)
    assert result.status == "fail" and "whole flat weights" in result.message


def test_a_stub_is_todo():
    def stub(comm, backward, shard, optimizer, layout):
        raise NotImplementedError
    assert check_zero2_step(stub, quiet=True).status == "todo"
