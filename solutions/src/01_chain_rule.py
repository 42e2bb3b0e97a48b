# %% [markdown]
# # Exercise 01b · Backpropagation from the chain rule
#
# Chapter 1, section 0.1, derived every gradient of a two-layer network with the chain,
# product and sum rules for tanh and softmax + cross-entropy. Here you do it for the
# lecture's own pair: a **sigmoid** hidden layer and the **quadratic cost**. The network,
# one sample per row (n rows), is
#
# $$z_1 = X W_1 + b_1, \qquad a_1 = \sigma(z_1) = \frac{1}{1 + e^{-z_1}}, \qquad
#   z_2 = a_1 W_2 + b_2, \qquad L = \frac{1}{2n} \sum_{i=1}^n \lVert z_{2,i} - T_i \rVert^2 .$$
#
# Write `two_layer_backward(W1, b1, W2, b2, X, T)`; it returns a dict with
# $\partial L/\partial u$ for every $u$ in `"z2", "W2", "b2", "a1", "z1", "W1", "b1"`, each of
# the shape of $u$. Go backwards, one rule per line:
#
# | gradient | rule |
# |---|---|
# | $\partial L/\partial z_2$ | differentiate the cost: $(z_2 - T)/n$ |
# | $\partial L/\partial W_2$, $\partial L/\partial b_2$ | product rule on $z_2[i,k] = \sum_j a_1[i,j] W_2[j,k] + b_2[k]$, sum rule over the rows $i$ |
# | $\partial L/\partial a_1$ | $a_1[i,j]$ feeds every output $k$ (weight $W_2[j,k]$): sum rule over $k$ |
# | $\partial L/\partial z_1$ | chain rule through the sigmoid: $\sigma' = \sigma(1-\sigma) = a_1(1 - a_1)$ |
# | $\partial L/\partial W_1$, $\partial L/\partial b_1$ | as for layer 2, one layer down |
#
# The check compares every one of them with central differences of the loss
# $\big(L(u + \varepsilon) - L(u - \varepsilon)\big)/2\varepsilon$, in that order, so its
# message names the first gradient that is wrong. Do not modify the inputs in place.

# %%
import numpy as np

from coursekit.data import load_digits
from coursekit.grading.ch01 import check_two_layer_backward
from coursekit.nn import reference

# %%
def two_layer_backward(W1, b1, W2, b2, X, T):
    """Return {"z2", "W2", "b2", "a1", "z1", "W1", "b1"}: dL/du for each u."""
    # Hint: forward first (z1, a1, z2), then dL/dz2 = (z2 - T) / n and one rule per gradient
    ### BEGIN SOLUTION
    n = len(X)
    z1 = X @ W1 + b1
    a1 = 1 / (1 + np.exp(-z1))
    z2 = a1 @ W2 + b2
    g = {"z2": (z2 - T) / n}
    g["W2"] = a1.T @ g["z2"]
    g["b2"] = g["z2"].sum(axis=0)
    g["a1"] = g["z2"] @ W2.T
    g["z1"] = g["a1"] * a1 * (1 - a1)
    g["W1"] = X.T @ g["z1"]
    g["b1"] = g["z1"].sum(axis=0)
    return g
    ### END SOLUTION


# %%
check_two_layer_backward(two_layer_backward)

# %% [markdown]
# ## Your gradient descends
#
# Fit the digits with your gradients: one-hot targets, the quadratic cost, full-batch
# gradient descent $w \leftarrow w - r\,\partial L/\partial w$. Each step changes the loss by
# about $-r \lVert \nabla L \rVert^2$ (chapter 1, section 0.2), so with a small enough rate
# (0.2 here) every step lowers it.

# %%
digits = load_digits(dtype=np.float64)
X, T = digits.X_train, reference.one_hot(digits.y_train, 10)
rng = np.random.default_rng(0)
params = {"W1": rng.standard_normal((64, 32)) / 8, "b1": np.zeros(32),
          "W2": rng.standard_normal((32, 10)) / np.sqrt(32), "b2": np.zeros(10)}


def quadratic_loss(p):
    a1 = 1 / (1 + np.exp(-(X @ p["W1"] + p["b1"])))
    return 0.5 * np.sum((a1 @ p["W2"] + p["b2"] - T) ** 2) / len(X)


losses = [quadratic_loss(params)]
for _ in range(100):
    grads = two_layer_backward(params["W1"], params["b1"], params["W2"], params["b2"], X, T)
    params = {k: v - 0.2 * grads[k] for k, v in params.items()}
    losses.append(quadratic_loss(params))
accuracy = np.mean(np.argmax(1 / (1 + np.exp(-(digits.X_test @ params["W1"] + params["b1"]))) @ params["W2"]
                             + params["b2"], axis=1) == digits.y_test)
print(f"quadratic cost: {losses[0]:.2f} at the start, after 100 steps ≈{losses[-1]:.2f}; test accuracy ≈{accuracy:.0%}")
assert np.all(np.diff(losses) < 0), "a step raised the loss: is the rate 0.2?"
assert losses[-1] < 0.25 * losses[0] and accuracy > 0.8
print("PASS: every one of the 100 steps lowered the loss")
