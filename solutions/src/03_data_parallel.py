# %% [markdown]
# # Exercise 03 · The data-parallel training step
#
# Every rank holds the same model `mlp` (its parameters are one flat buffer,
# `mlp.params`) and gets its own rows `X, y` of a global batch of `batch_size` rows.
# One step of synchronous data-parallel SGD:
#
# 1. compute this rank's mean loss and gradient: `loss, grad = mlp.loss_and_grad(X, y)`;
# 2. weight it by this rank's share of the batch, $n_k / B$ (`len(X) / batch_size`), and
#    sum the weighted gradients of all ranks with an allreduce
#    (`coursekit.collectives.allreduce(comm, array)`): the result
#    $g = \sum_k \frac{n_k}{B} g_k$ is the gradient of the whole batch;
# 3. update the parameters in place: $w \leftarrow w - \eta\, g$
#    (`mlp.params[...] -= lr * g`), and return the local loss.
#
# The check runs your step on 1 to 4 ranks (threads in this process), with batches that
# split evenly and unevenly, and compares the parameters with serial SGD on the whole batch.
#
# TIP: `coursekit.comm.run_local(fn, 3)` runs `fn(comm)` on 3 ranks;
# `coursekit.comm.set_verbose()` prints every message.

# %%
import numpy as np

from coursekit.collectives import allreduce
from coursekit.grading.ch03 import check_data_parallel_step


# %%
def dp_step(comm, mlp, X, y, batch_size, lr):
    """One synchronous SGD step on this rank's rows; returns the local mean loss."""
    ### BEGIN SOLUTION
    loss, grad = mlp.loss_and_grad(X, y)
    total = allreduce(comm, grad * (len(X) / batch_size))
    mlp.params[...] -= lr * total
    return loss
    ### END SOLUTION


# %%
check_data_parallel_step(dp_step)

# %% [markdown]
# ## Your step trains the digits like one big batch
#
# Four ranks, 16 rows each per step, against chapter 1's serial `train` with batch 64.

# %%
from coursekit.comm import run_local
from coursekit.data import load_digits
from coursekit.nn import MLP, train

digits = load_digits(dtype=np.float64)
X, y = digits.X_train[:640], digits.y_train[:640]


def train_ranks(comm, epochs=3, batch=64):
    mlp = MLP([64, 32, 10], dtype=np.float64, seed=0)
    rng = np.random.default_rng(0)  # every rank draws the same shuffles
    for _ in range(epochs):
        order = rng.permutation(len(X))
        for start in range(0, len(X), batch):
            mine = np.array_split(order[start:start + batch], comm.size)[comm.rank]
            dp_step(comm, mlp, X[mine], y[mine], batch, 0.1)
    return mlp.params


parallel = run_local(train_ranks, 4)[0]
serial = MLP([64, 32, 10], dtype=np.float64, seed=0)
train(serial, X, y, epochs=3, batch_size=64, lr=0.1, seed=0)
assert np.allclose(parallel, serial.params, rtol=1e-10, atol=1e-12), np.abs(parallel - serial.params).max()
print("PASS: the same parameters, to float64 rounding")
