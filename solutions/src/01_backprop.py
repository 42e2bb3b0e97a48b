# %% [markdown]
# # Exercise 01 · The backward pass of one layer
#
# You write the heart of backpropagation: the backward pass of one fully connected layer.
# The check compares your function with the course's reference on random layer shapes and
# every activation; then your function trains a network on the digits.
#
# A layer takes a mini-batch with **one sample per row** and computes
#
# $$A = \sigma(A_{prev} W + b), \qquad W \text{ of shape } (n_{in}, n_{out})$$
#
# (our `W` is the transpose of the lecture's $W^l$, which acts on one column vector).
# Given the upstream gradient $G = \partial C / \partial A$ — for the last layer the output
# error, otherwise what the next layer's backward pass returned — the lecture's equations
# become:
#
# | lecture (one sample, columns) | code (batch, rows) | shape |
# |---|---|---|
# | $\delta^l = \big((W^{l+1})^T\delta^{l+1}\big) \odot \sigma'(z^l)$ | `delta = grad_a * dsigma` | $(n, n_{out})$ |
# | $\partial C/\partial W^l = \delta^l (a^{l-1})^T$, summed over samples | `dW = a_prev.T @ delta` | $(n_{in}, n_{out})$ |
# | $\partial C/\partial b^l = \delta^l$, summed over samples | `db = delta.sum(axis=0)` | $(n_{out},)$ |
# | $(W^l)^T \delta^l$, the next upstream gradient | `grad_a_prev = delta @ W.T` | $(n, n_{in})$ |
#
# $\sigma'(z)$ written with the output $a = \sigma(z)$:
# relu $\to$ 1 where $a > 0$, else 0; sigmoid $\to a(1-a)$; tanh $\to 1 - a^2$;
# identity (the linear output layer) $\to 1$.
#
# TIP: test on tiny arrays first, e.g. `layer_backward(np.ones((2, 3)), np.ones((1, 2)), np.ones((1, 3)), np.ones((1, 3)), "relu")`.
# Do not modify the input arrays in place: the caller still needs them.

# %%
import numpy as np

from coursekit.data import load_digits
from coursekit.grading.ch01 import check_layer_backward
from coursekit.nn import MLP, layout, reference

# %%
def layer_backward(W, a_prev, a, grad_a, activation):
    """Return (dW, db, grad_a_prev) for one layer, given grad_a = dC/da."""
    # Hint: delta = grad_a * sigma'(z) written with a; then dW, db and grad_a_prev
    ### BEGIN SOLUTION
    if activation == "relu":
        dsigma = (a > 0).astype(a.dtype)
    elif activation == "sigmoid":
        dsigma = a * (1 - a)
    elif activation == "tanh":
        dsigma = 1 - a * a
    else:  # identity: the linear output layer
        dsigma = np.ones_like(a)
    delta = grad_a * dsigma
    return a_prev.T @ delta, delta.sum(axis=0), delta @ W.T
    ### END SOLUTION


# %%
check_layer_backward(layer_backward)

# %% [markdown]
# ## Your backward pass inside a whole network
#
# Backpropagation is your function called from the last layer to the first, each call
# passing `grad_a_prev` down as the next `grad_a`. The forward pass and the output error
# of softmax + cross-entropy, $\delta^L = (\mathrm{softmax}(z^L) - \mathrm{onehot}(y))/n$,
# come from the reference. The gradient lands in one flat buffer, laid out like
# `mlp.params`, so we can compare it with the course's Numba MLP.

# %%
def my_loss_and_grad(params, sizes, activation, X, y):
    acts = reference.forward(params, sizes, activation, X)  # [X, A^1, ..., A^L]
    loss, grad_a = reference.softmax_xent(acts[-1], y)
    grad = np.empty_like(params)
    weights = layout.views(params, sizes)
    grads = layout.views(grad, sizes)
    for i in reversed(range(len(weights))):
        act = activation if i < len(weights) - 1 else "identity"
        dW, db, grad_a = layer_backward(weights[i][0], acts[i], acts[i + 1], grad_a, act)
        grads[i][0][...], grads[i][1][...] = dW, db
    return loss, grad


digits = load_digits(dtype=np.float64)
mlp = MLP([64, 32, 10], "tanh", dtype=np.float64, seed=0)
X, y = digits.X_train[:64], digits.y_train[:64]
mine = my_loss_and_grad(mlp.params, mlp.sizes, mlp.activation, X, y)[1]
print("same gradient as the Numba MLP:", np.allclose(mine, mlp.loss_and_grad(X, y)[1]))
assert np.allclose(mine, mlp.loss_and_grad(X, y)[1]), "your backward pass and the Numba MLP disagree"

# %% [markdown]
# And train with it: plain mini-batch SGD, $w \leftarrow w - \eta\, g$, five epochs.

# %% tags=["nbval-ignore-output"]
params = mlp.params.copy()
rng = np.random.default_rng(0)
for epoch in range(5):
    order = rng.permutation(len(digits.X_train))
    for start in range(0, len(order), 32):
        batch = order[start:start + 32]
        loss, grad = my_loss_and_grad(params, mlp.sizes, mlp.activation, digits.X_train[batch], digits.y_train[batch])
        params -= 0.1 * grad
mlp.params[...] = params
accuracy = mlp.accuracy(digits.X_test, digits.y_test)
print(f"test accuracy after 5 epochs with your backward pass: {accuracy:.1%}")
assert accuracy > 0.9
