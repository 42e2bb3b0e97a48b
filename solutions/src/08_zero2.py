# %% [markdown]
# # Exercise 08 · ZeRO-2's gradient step
#
# Plain data parallelism keeps the whole gradient and the whole optimizer state on every
# one of the N ranks, and allreduces the gradient. **ZeRO stage 2** keeps, on rank r, only
# shard r of the gradient and of the optimizer state (1/N of each), and still computes
# exactly the step of plain data parallelism:
#
# 1. **reduce-scatter** the gradient: rank r receives shard r of the *sum* over all ranks
#    ($(N-1)/N\,\Psi$ values sent per rank);
# 2. **update** shard r of the weights with the optimizer (its state covers that shard only);
# 3. **all-gather** the updated shards so every rank has all the weights for the next
#    forward ($(N-1)/N\,\Psi$ again).
#
# Together: $2(N-1)/N\,\Psi$ per rank, exactly one allreduce's volume (a ring allreduce *is*
# a reduce-scatter followed by an all-gather), for $1/N$ of the gradient and optimizer memory.
#
# The shards follow a `layout` (`coursekit.parallel.zero.ShardLayout`): each layer's block
# of the flat buffer is padded with zeros to N equal chunks, and rank r's shard is chunk r
# of every layer, C values in all.
#
# * `layout.rows(flat)` is the flat buffer as an (N, C) array whose row r is rank r's shard;
#   `reduce_scatter(comm, rows)` returns row `comm.rank` of the sum, shape (1, C);
# * `layout.flat_into(rows, flat)` writes an (N, C) array back into a flat buffer;
# * `allgather(comm, shard)` returns the N shards one after another (N C values).
#
# TIP: try your function on 2 ranks with `coursekit.comm.run_local`;
# `coursekit.comm.set_verbose()` prints every message.

# %%
import numpy as np

from coursekit.collectives import allgather, reduce_scatter
from coursekit.grading.ch08 import check_zero2_step

# %% [markdown]
# Write `zero2_step(comm, grad, shard, optimizer, layout)`: `grad` is this rank's share of
# the global batch's gradient (the full flat length; the sum over ranks is the whole
# gradient), `shard` is this rank's shard of the weights and `optimizer` updates it in
# place (`optimizer.step(shard_gradient)`). Return the whole flat weights (an array as long
# as `grad`). The check trains on 3 ranks, compares every step with serial training and
# counts the bytes sent: a reduce-scatter plus an all-gather, nothing more.

# %%
def zero2_step(comm, grad, shard, optimizer, layout):
    """Reduce-scatter the gradient, update my shard, all-gather the weights."""
    ### BEGIN SOLUTION
    optimizer.step(reduce_scatter(comm, layout.rows(grad))[0])
    params = np.empty(grad.shape, grad.dtype)
    layout.flat_into(allgather(comm, shard).reshape(comm.size, layout.width), params)
    return params
    ### END SOLUTION


# %%
check_zero2_step(zero2_step)
