# %% [markdown]
# # Exercise 02 · Ring allreduce and binomial broadcast
#
# You write two collectives with nothing but point-to-point messages:
# `comm.send(array, dest)`, `comm.recv(source)` and
# `comm.sendrecv(sendbuf, dest, source=...)` (send and receive at once, never deadlocks).
# `comm.rank` is this rank's number, `comm.size` the number of ranks `p`.
#
# The checks run your function on `p = 1 … 6` ranks (threads in this process) and grade
# the **result** and the **communication volume** read from the ranks' traces,
# against the cost model of the lecture.
#
# TIP: try your function with `coursekit.comm.run_local(ring_allreduce, 3, np.arange(5.0))`;
# `coursekit.comm.set_verbose()` prints every message, `set_verbose(False)` stops it.

# %%
import numpy as np

from coursekit.grading.ch02 import check_binomial_bcast, check_ring_allreduce

# %% [markdown]
# ## 1. Ring allreduce
#
# Split `x` into `p` chunks (`np.array_split`: lengths need not divide by `p`).
#
# * **Reduce-scatter**, `p - 1` steps: in step `k` rank `r` sends chunk `(r - 1 - k) % p` to
#   its right neighbour `(r + 1) % p` and adds the chunk `(r - 2 - k) % p` that arrives from
#   its left neighbour. Afterwards rank `r` holds the full sum of chunk `r`.
# * **Allgather**, `p - 1` steps: in step `k` rank `r` sends chunk `(r - k) % p` to the right
#   and stores the chunk `(r - 1 - k) % p` that arrives from the left.
#
# Each rank sends `2(p-1)` messages of about `n/p` items: $2(p-1)\alpha + 2\frac{p-1}{p}n\beta$,
# whatever `p`: the algorithm behind Horovod and NCCL.

# %%
def ring_allreduce(comm, x):
    """Sum of x over all ranks, on every rank, by reduce-scatter + allgather on a ring."""
    ### BEGIN SOLUTION
    p, r = comm.size, comm.rank
    chunks = [c.copy() for c in np.array_split(x, p)]
    right, left = (r + 1) % p, (r - 1) % p
    for k in range(p - 1):
        chunks[(r - 2 - k) % p] += comm.sendrecv(chunks[(r - 1 - k) % p], right, source=left)
    for k in range(p - 1):
        chunks[(r - 1 - k) % p] = comm.sendrecv(chunks[(r - k) % p], right, source=left)
    return np.concatenate(chunks)
    ### END SOLUTION


# %%
check_ring_allreduce(ring_allreduce)

# %% [markdown]
# ## 2. Binomial-tree broadcast
#
# Number the ranks relative to the root, `v = (rank - root) % p`. In round `k` every rank
# that already has the data (`v < 2**k`) sends it to `v + 2**k` (if that rank exists).
# After `ceil(log2 p)` rounds everybody has it: $\lceil \log_2 p \rceil(\alpha + n\beta)$
# instead of $(p-1)(\alpha + n\beta)$ for the root sending to everyone.
#
# Non-root ranks are called with `x = None`; every rank returns the root's array.

# %%
def binomial_bcast(comm, x, root):
    """The root's x on every rank, along a binomial tree."""
    ### BEGIN SOLUTION
    p, v = comm.size, (comm.rank - root) % comm.size
    k = 1
    while k < p:
        if k <= v < 2 * k:
            x = comm.recv((v - k + root) % p)
        elif v < k and v + k < p:
            comm.send(x, (v + k + root) % p)
        k *= 2
    return x
    ### END SOLUTION


# %%
check_binomial_bcast(binomial_bcast)
