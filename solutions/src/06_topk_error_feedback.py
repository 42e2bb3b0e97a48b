# %% [markdown]
# # Exercise 06 · Top-k sparsification with error feedback
#
# Data-parallel workers average their gradients every step. At 99% sparsity a worker
# sends only the 1% of entries of largest magnitude: `k` indices and `k` values instead
# of `n` values. What it does not send is not thrown away: **error feedback** keeps it in
# a residual and adds it to the next gradient,
#
# $$x_t = g_t + e_t, \qquad \text{sent}_t = \mathrm{top}_k(x_t), \qquad e_{t+1} = x_t - \text{sent}_t,$$
#
# so that $\sum_t \text{sent}_t + e_T = \sum_t g_t$: nothing is lost, only delayed.
#
# The workers' sparse vectors have different supports, so they cannot be summed by an
# allreduce: every worker **allgathers** the others' indices and values and adds them up.
#
# TIP: try your function with
# `coursekit.comm.run_local(topk_ef_exchange, 2, np.arange(6.0), np.zeros(6), 0.5)`;
# `coursekit.comm.set_verbose()` prints every message.

# %%
import numpy as np

from coursekit.collectives import allgather
from coursekit.grading.ch06 import check_topk_error_feedback

# %% [markdown]
# ## Top-k with error feedback, in one exchange
#
# 1. `x = grad + residual`, and `k = max(1, round(ratio * x.size))`;
# 2. the indices of the `k` largest `|x|` (`np.argpartition`), as **int32** (4 bytes each);
# 3. the new residual: `x` with those `k` entries set to 0;
# 4. `allgather(comm, indices)` and `allgather(comm, values)` (`check=False`: no extra
#    message) give every rank the `p * k` indices and values of all ranks;
# 5. the mean: add every value at its index (indices from different ranks may repeat:
#    `np.add.at` adds them all, `mean[idx] += values` would keep only one) and divide by `p`.
#
# Return `(mean, new_residual)`. The check verifies the residual, the mean, the bytes on
# the wire (`p(p-1) k (4 + 8)` per step for float64) and that 2 workers on digits reach
# uncompressed accuracy within 1 point at 99% sparsity.

# %%
def topk_ef_exchange(comm, grad, residual, ratio):
    """Top-k of grad + residual, allgathered; returns (mean over ranks, new residual)."""
    ### BEGIN SOLUTION
    x = grad + residual
    k = max(1, round(ratio * x.size))
    idx = np.argpartition(np.abs(x), x.size - k)[x.size - k:].astype(np.int32)
    values = x[idx]
    new_residual = x.copy()
    new_residual[idx] = 0
    all_idx = allgather(comm, idx, check=False)
    all_values = allgather(comm, values, check=False)
    mean = np.zeros_like(x)
    np.add.at(mean, all_idx, all_values)
    return mean / comm.size, new_residual
    ### END SOLUTION


# %%
check_topk_error_feedback(topk_ef_exchange)

# %% [markdown]
# Without the residual (always pass `np.zeros_like(grad)`), the small entries that add
# up over many steps are never sent: the notebook of chapter 6 shows what that costs.
