# %% [markdown]
# # Exercise 08 · ZeRO-2's gradient step, bucket by bucket
#
# Plain data parallelism keeps the whole gradient and the whole optimizer state on every
# one of the N ranks, and allreduces the gradient. **ZeRO-1** keeps only shard r of the
# optimizer state on rank r: after the backward it reduce-scatters the *whole* gradient,
# updates its shard of the weights and all-gathers them. The full gradient still sits in
# memory until the backward ends.
#
# **ZeRO-2** also partitions the gradient. It does not wait for the whole gradient: as the
# backward pass produces a bucket (here: one layer's block, last layer first), the rank
# **reduce-scatters it at once**, keeps only its own chunk of the sum and frees the bucket.
# A rank then never holds more than its $1/N$ shard of the summed gradient plus the bucket
# in hand, and the reduce-scatters overlap the rest of the backward:
#
# 1. for each block the backward produces: **reduce-scatter** it (rank r receives chunk r
#    of the *sum* over all ranks), store that chunk in its place in the gradient shard,
#    drop the block;
# 2. **update** shard r of the weights with the optimizer (its state covers that shard only);
# 3. **all-gather** the updated shards so every rank has all the weights for the next
#    forward.
#
# Together: $2(N-1)/N\,\Psi$ values sent per rank, exactly one allreduce's volume, for
# $1/N$ of the gradient and optimizer memory. The result is exactly ZeRO-1's (and serial
# training's) step.
#
# The shards follow a `layout` (`coursekit.parallel.zero.ShardLayout`) for N =
# `layout.n_ranks` ranks (the same as `comm.size`): each layer's block
# of the flat buffer is padded with zeros to N equal chunks of `layout.chunks[l]` values, and
# rank r's shard is chunk r of every layer, C = `layout.width` values in all; layer l's chunk
# sits at `layout.offsets[l]:layout.offsets[l + 1]` of the shard.
#
# * `layout.padded(l, block)` is layer l's block as an (N, c_l) array (zero-padded);
#   `reduce_scatter(comm, rows)` returns row `comm.rank` of the sum, shape (1, c_l);
# * `layout.flat_into(rows, flat)` writes an (N, C) array back into a flat buffer of
#   `layout.spans[-1].stop` values (the number of parameters);
# * `allgather(comm, shard)` returns the N shards one after another (N C values): reshape
#   them to (`layout.n_ranks`, `layout.width`) rows for `layout.flat_into`.
#
# TIP: try your function on 2 ranks with `coursekit.comm.run_local`;
# `coursekit.comm.set_verbose()` prints every message.

# %%
import numpy as np

from coursekit.collectives import allgather, reduce_scatter
from coursekit.grading.ch08 import check_zero2_step

# %% [markdown]
# Write `zero2_step(comm, backward, shard, optimizer, layout)`. `backward` yields
# `(l, block)` pairs as the backward pass produces them, last layer first: `block` is layer
# l's flat gradient, this rank's share of the global batch's (the sum over ranks is the
# whole gradient). `shard` is this rank's shard of the weights and `optimizer` updates it in
# place (`optimizer.step(shard_gradient)`). Return the whole flat weights.
#
# The check trains on 4 ranks and compares every step with serial training; it watches the
# backward: when it produces a block, your rank must already have reduce-scattered every
# earlier one and hold none of them (it prints the peak gradient memory you held); and it
# counts the bytes: the reduce-scatters plus one all-gather, nothing more.

# %%
def zero2_step(comm, backward, shard, optimizer, layout):
    """Reduce-scatter each gradient block as it arrives, update my shard, all-gather the weights."""
    ### BEGIN SOLUTION
    grad_shard = np.empty(layout.width, shard.dtype)
    for l, block in backward:
        grad_shard[layout.offsets[l]:layout.offsets[l + 1]] = reduce_scatter(comm, layout.padded(l, block))[0]
        del block  # the bucket is freed: only my chunk of its sum stays
    optimizer.step(grad_shard)
    params = np.empty(layout.spans[-1].stop, shard.dtype)
    layout.flat_into(allgather(comm, shard).reshape(layout.n_ranks, layout.width), params)
    return params
    ### END SOLUTION


# %%
check_zero2_step(zero2_step)
