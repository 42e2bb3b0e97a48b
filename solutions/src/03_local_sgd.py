# %% [markdown]
# # Exercise 03b · Local SGD: averaging the parameters every k steps
#
# Chapter 3, section 9: instead of combining the gradients at every step, every worker
# steps on **its own** gradient and the workers average their **parameters** every $k$
# steps (local SGD, the lectures' parameter averaging). Rank $r$ holds its own model
# `mlp` and gets `batches`, one `(X, y)` per step: its rows of a global batch of
# `batch_size` rows. Write `local_sgd` so that, on every rank:
#
# 1. each step updates the local model on the local mean gradient:
#    `loss, grad = mlp.loss_and_grad(X, y)`, then $w_r \leftarrow w_r - \eta\, g_r$;
# 2. after every $k$-th step, **and after the last step** (when $k$ does not divide the
#    number of steps, the last period is shorter), the ranks replace their parameters by
#    the weighted average, one allreduce (`coursekit.collectives.allreduce(comm, array)`):
#
#    $$w \leftarrow \sum_r s_r\, w_r, \qquad s_r = \frac{\text{rows rank } r \text{ trained on since the last average}}{(\text{steps since the last average}) \cdot B}.$$
#
#    $s_r$ is rank $r$'s share of the rows of those steps, so the shares sum to 1 (with
#    uneven shards they are not $1/p$). Update `mlp.params` in place.
#
# With $k = 1$ this is exactly synchronous SGD on the whole batch (chapter 3, section 2).
# The check runs your function on 1 to 4 ranks (threads in this process) with even and
# uneven shards and several $k$, and compares the parameters with local SGD computed
# serially (the tests check that reference against the library's `exchange="average"`).
#
# TIP: `coursekit.comm.run_local(fn, 3)` runs `fn(comm)` on 3 ranks;
# `coursekit.comm.set_verbose()` prints every message.

# %%
import numpy as np

from coursekit.collectives import allreduce
from coursekit.grading.ch03 import check_local_sgd


# %%
def local_sgd(comm, mlp, batches, batch_size, lr, k):
    """Local SGD on this rank's ``batches``, parameters averaged every ``k`` steps and after the last."""
    ### BEGIN SOLUTION
    rows, since = 0, 0
    for step, (X, y) in enumerate(batches):
        loss, grad = mlp.loss_and_grad(X, y)
        mlp.params[...] -= lr * grad
        rows, since = rows + len(X), since + 1
        if (step + 1) % k == 0 or step == len(batches) - 1:
            share = rows / (since * batch_size)
            mlp.params[...] = allreduce(comm, mlp.params * share)
            rows, since = 0, 0
    ### END SOLUTION


# %%
check_local_sgd(local_sgd)

# %% [markdown]
# ## Your local SGD is the library's
#
# Four ranks on the digits, 64 rows per step, averaging every 4 steps, for 21 steps (so
# the last period has 1 step; every batch of the first epoch is full): the same rows per
# rank as the library's sampler gives, against `data_parallel.train` with
# `exchange="average"`, `average_every=4`.

# %%
from coursekit.cluster.runner import LocalRunner
from coursekit.comm import run_local
from coursekit.data import load_digits
from coursekit.nn import MLP
from coursekit.parallel import data_parallel
from coursekit.parallel.data_parallel import DPConfig
from coursekit.parallel.data_parallel.sampler import Sampler

digits = load_digits(dtype=np.float64)
X, y = digits.X_train, digits.y_train
cfg = DPConfig(sizes=(64, 32, 10), dtype="float64", batch_size=64, epochs=1, max_steps=21, lr=0.3,
               exchange="average", average_every=4, seed=0)


def my_run(comm):
    sampler = Sampler(len(X), cfg.batch_size, cfg.seed)  # the library's rows for this rank
    mine = [sampler.local(step, comm.rank, comm.size)[0] for step in range(cfg.max_steps)]
    mlp = MLP(cfg.sizes, dtype=np.float64, seed=cfg.seed)
    local_sgd(comm, mlp, [(X[rows], y[rows]) for rows in mine], cfg.batch_size, cfg.lr,
              cfg.average_every)
    return mlp.params


mine = run_local(my_run, 4)[0]
library = data_parallel.train(LocalRunner(4), cfg, (X, y))
assert np.allclose(mine, library.params, rtol=1e-10, atol=1e-12), np.abs(mine - library.params).max()
print("PASS: the same parameters, to float64 rounding")
