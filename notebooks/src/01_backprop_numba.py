# %% [markdown]
# # 01 · Backpropagation from scratch, made fast with Numba
#
# Before we spread training over many workers we need one worker that trains well and
# fast. This chapter builds it: a multilayer perceptron (MLP) trained by mini-batch SGD,
# with the backpropagation equations of the lecture turned into code, checked against
# finite differences, and compiled with Numba for the CPU (and numba.cuda for a GPU).
# Then we ask the lecture's question: why is training **compute-bound**, and how long
# must it take at the very least?
#
# It starts from the foundations (section 0): the backpropagation equations derived with
# the chain, product and sum rules, and why a gradient step lowers the loss. Section 3
# adds full-batch gradient descent against SGD and mini-batches, a train / validation /
# test workflow, and whether small batches generalize better; section 5 the lecture's
# work per layer type.
#
# Everything here runs in this notebook's own process; the cluster comes back in chapter 2.
# The parameters of the model live in **one flat buffer** — the later chapters average,
# shard and compress exactly that buffer.

# %%
import inspect

import matplotlib.pyplot as plt
import numpy as np

from coursekit.data import load_digits
from coursekit.nn import MLP, flops, gradcheck, reference, train
from coursekit.viz import integer_ticks, legend_outside, series_color, show
from coursekit.widgets.backprop import BackpropPanel, LivePlot

digits = load_digits()
digits

# %% [markdown]
# The compute runs in Numba kernels compiled to machine code. The first time the course
# runs on a machine they are compiled (10–30 s on a laptop); afterwards they load from
# Numba's cache in a fraction of a second. The next cell does that now, so no later cell
# sits silent.

# %% tags=["nbval-ignore-output"]
from coursekit.nn.warmup import warm_up

print(warm_up())

# %% [markdown]
# ## 0. Foundations: where the equations come from
#
# Training fits a model $y = f(x, w)$ by minimizing the average loss $L(D, w) \ge 0$ over
# the data set $D$. Gradient descent needs the **gradient**
# $\nabla L = (\partial L/\partial w_1, \dots, \partial L/\partial w_k)$, the vector of partial
# derivatives, each the limit $\partial L/\partial w_i = \lim_{h\to 0} \big(L(w + h e_i) - L(w)\big)/h$.
# This section derives backpropagation from three rules of calculus, checks every step
# numerically, and shows why a step against the gradient lowers the loss.
#
# ### 0.1 Backpropagation from the chain, product and sum rules
#
# Take a two-layer network, one sample per row ($n$ rows), a tanh hidden layer and
# softmax + cross-entropy on a linear output:
#
# $$z_1 = X W_1 + b_1, \qquad a_1 = \tanh(z_1), \qquad z_2 = a_1 W_2 + b_2, \qquad
#   L = -\frac{1}{n}\sum_i \log \mathrm{softmax}(z_{2,i})_{y_i}.$$
#
# The three rules, for scalars: the **chain rule** $\frac{dL}{du} = \frac{dL}{dv}\frac{dv}{du}$
# when $L$ depends on $u$ through $v$; the **product rule** $d(uv) = v\,du + u\,dv$, so a term
# $z = a w$ gives $\partial z/\partial w = a$ and $\partial z/\partial a = w$; the **sum rule**
# $d(u+v) = du + dv$, so a quantity used in several places collects one term from each.
# From the loss backwards:
#
# | gradient | rule | result |
# |---|---|---|
# | $\partial L/\partial z_2$ | differentiate the loss | $(\mathrm{softmax}(z_2) - \mathrm{onehot}(y))/n$ |
# | $\partial L/\partial W_2$ | product rule on $z_2[i,k] = \sum_j a_1[i,j] W_2[j,k] + b_2[k]$, sum rule over rows $i$ | $a_1^T\, \partial L/\partial z_2$ |
# | $\partial L/\partial b_2$ | $\partial z_2[i,k]/\partial b_2[k] = 1$ in every row: sum rule | $\partial L/\partial z_2$ summed over rows |
# | $\partial L/\partial a_1$ | $a_1[i,j]$ feeds every output $k$ with weight $W_2[j,k]$: product and sum rules | $\partial L/\partial z_2\, W_2^T$ |
# | $\partial L/\partial z_1$ | chain rule through $a_1 = \tanh(z_1)$, $\tanh' = 1 - a_1^2$ | $\partial L/\partial a_1 \odot (1 - a_1^2)$ |
# | $\partial L/\partial W_1$, $\partial L/\partial b_1$ | as for layer 2 | $X^T \partial L/\partial z_1$, rows summed |
#
# These are the lecture's four equations ($\delta^l = \partial L/\partial z^l$), derived. In code:

# %%
from coursekit.nn import chain_rule

print(inspect.getsource(chain_rule.backward))

# %% [markdown]
# Now check **each intermediate on its own**: perturb one entry of it by $\pm\varepsilon$,
# recompute the loss from that point on (`chain_rule.loss_from`), and take the central
# difference $\big(L(u+\varepsilon) - L(u-\varepsilon)\big)/2\varepsilon$ ($\varepsilon = 10^{-6}$,
# float64, error $O(\varepsilon^2)$ plus rounding of about $10^{-16}/\varepsilon$). A correct
# rule agrees to better than $10^{-6}$ of the largest entry; a wrong one is off by order 1.
# A 64-16-10 network on 8 digits:

# %%
net = chain_rule.TwoLayerNet.random(64, 16, 10, activation="tanh", seed=0)
X8, y8 = digits.X_train[:8].astype(np.float64), digits.y_train[:8]
analytic = chain_rule.backward(net, X8, y8)
for name in chain_rule.INTERMEDIATES:
    numeric = chain_rule.numeric_gradient(net, X8, y8, name)
    rel = np.max(np.abs(analytic[name] - numeric)) / np.max(np.abs(numeric))
    assert analytic[name].shape == numeric.shape and rel < 1e-6, (name, rel)
    print(f"dL/d{name:<3} {str(numeric.shape):>9}: the rule agrees with central differences to < 1e-6")
print("PASS: every intermediate of backpropagation equals its finite-difference estimate")

# %% [markdown]
# ### 0.2 Why a gradient step lowers the loss
#
# A step $w' = w - r\,\nabla L$ with learning rate $r > 0$ changes the loss by, to first order
# (Taylor),
#
# $$\Delta L = L(w') - L(w) \approx \nabla L \cdot (w' - w) = -r\,\lVert \nabla L \rVert^2 \le 0 .$$
#
# The next term is $\tfrac{r^2}{2} \nabla L^T H \nabla L$ ($H$ the matrix of second
# derivatives), so the prediction's relative error grows like $r$, and for a large enough $r$
# the step overshoots and the loss rises. We measure it with full-batch gradient descent
# on all 1,347 training images (a 64-32-10 tanh network, float64, one thread): predicted
# against actual $\Delta L$ for 10 steps at three rates.

# %%
from coursekit.nn import descent
from coursekit.nn.speed import single_thread

net = chain_rule.TwoLayerNet.random(64, 32, 10, activation="tanh", seed=0)
X_all, y_all = digits.X_train.astype(np.float64), digits.y_train
with single_thread():
    gd = {r: descent.gd_steps(net, X_all, y_all, r, 10) for r in (0.01, 0.1, 1.0)}
print(f"{'rate':>6}{'step 1: predicted':>19}{'actual':>10}{'largest relative error over 10 steps':>39}")
for r, s in gd.items():
    print(f"{r:>6}{s.predicted[0]:>19.4f}{s.actual[0]:>10.4f}{s.rel_error.max():>39.1%}")
assert all(np.all(s.predicted < 0) and np.all(s.actual < 0) for s in gd.values())
assert gd[0.01].rel_error.max() < 0.01
assert 5 < gd[0.1].rel_error.max() / gd[0.01].rel_error.max() < 20  # ~ proportional to r
assert gd[1.0].rel_error.max() > 0.1
print("PASS: every step lowered the loss; at r = 0.01 the prediction is within 1 %, "
      "and its error grows about tenfold per tenfold rate")

# %% [markdown]
# Every step descends, and the first-order prediction is excellent for small steps and
# degrades in proportion to $r$. Where does it break? One step of each rate from the same
# weights, rates from 0.01 to 100:

# %%
with single_thread():
    sweep = descent.lr_sweep(net, X_all, y_all, np.geomspace(0.01, 100, 13))
print(f"{'rate':>8}{'predicted dL':>14}{'actual dL':>11}")
for r, p, a in zip(sweep.lrs, sweep.predicted, sweep.actual):
    print(f"{r:>8.3g}{p:>14.3g}{a:>11.3g}")
rise = sweep.first_rise
# a second-order estimate from the smallest step: (r^2/2) g'Hg = actual - predicted, so the
# quadratic model rises for r > 2 ||g||^2 / g'Hg = r_small / (relative error at r_small)
r_quad = sweep.lrs[0] * sweep.predicted[0] / (sweep.predicted[0] - sweep.actual[0])
print(f"the loss first rises at r = {rise:.3g}; the quadratic model from the smallest step predicts r ≈ {r_quad:.0f}")
assert np.all(sweep.predicted < 0)
assert np.all(sweep.actual[sweep.lrs < rise] < 0) and np.all(sweep.actual[sweep.lrs >= rise] > 0)
assert 1 < rise < 100 and sweep.actual[-1] > 0
assert rise / 5 < r_quad < rise * 5
print(f"PASS: below r = {rise:.3g} every step descends; from it on the loss rises although the "
      "first-order prediction still says it falls; the quadratic estimate is within a factor 5")

# %% [markdown]
# The first-order prediction always says "down" (it is $-r\lVert\nabla L\rVert^2$); beyond the
# rate printed above the loss goes up instead: the step is too long for the curvature of the
# loss, and the quadratic term wins. The quadratic model measured at the smallest step
# gets the order of magnitude of that rate. Practical rates (section 3 trains with 0.1 and
# sees spikes at 1) sit well below it, since a mini-batch gradient is noisier than this
# full-batch one and the curvature changes along the way.

# %% [markdown]
# ## 1. From the lecture's equations to code
#
# The lecture writes one sample as a column vector. Layer $l$ computes
#
# $$z^l = W^l a^{l-1} + b^l, \qquad a^l = \sigma(z^l)$$
#
# and, for a cost $C$, backpropagation is four equations:
#
# $$\delta^L = \nabla_a C \odot \sigma'(z^L), \qquad
#   \delta^l = \big((W^{l+1})^T \delta^{l+1}\big) \odot \sigma'(z^l), \qquad
#   \frac{\partial C}{\partial W^l} = \delta^l (a^{l-1})^T, \qquad
#   \frac{\partial C}{\partial b^l} = \delta^l .$$
#
# Code processes a whole mini-batch at once, one sample **per row**: $A^{l-1}$ is an
# $(n, n_{l-1})$ matrix and our `W` is $(W^l)^T$, of shape $(n_{l-1}, n_l)$, so the layer is
# `A = sigma(A_prev @ W + b)`. The four equations become three matrix products and two
# elementwise steps, and the sums over the samples of $\delta (a^{l-1})^T$ come for free
# inside `A_prev.T @ delta`. The derivative is written with the **output** $a$ (for the
# logistic function $\sigma' = a(1-a)$, as in the lecture), so a layer only has to keep $a$:

# %%
print(inspect.getsource(reference.layer_forward))
print(inspect.getsource(reference.layer_backward))

# %% [markdown]
# The upstream gradient `grad_a` is $(W^{l+1})^T\delta^{l+1}$ — what the next layer's
# `layer_backward` returned — so backpropagation is this function called from the last
# layer to the first. Let us confirm on three samples that the batch form is the lecture's
# per-sample form summed over the samples.

# %%
rng = np.random.default_rng(0)
W_lecture = rng.standard_normal((3, 4))  # W^l: (n_l, n_{l-1})
b = rng.standard_normal(3)
a_prev = rng.standard_normal((3, 4))  # three samples, one per row
grad_a = rng.standard_normal((3, 3))

a = reference.layer_forward(W_lecture.T, b, a_prev, "sigmoid")
dW, db, grad_a_prev = reference.layer_backward(W_lecture.T, a_prev, a, grad_a, "sigmoid")

dW_lecture = np.zeros_like(W_lecture)
for x in range(3):
    z = W_lecture @ a_prev[x] + b
    s = 1 / (1 + np.exp(-z))
    delta = grad_a[x] * s * (1 - s)  # delta^l = grad * sigma'(z^l)
    dW_lecture += np.outer(delta, a_prev[x])  # delta^l (a^{l-1})^T
    assert np.allclose(grad_a_prev[x], W_lecture.T @ delta)  # (W^l)^T delta^l
print("dC/dW equal:", np.allclose(dW, dW_lecture.T))
assert np.allclose(dW, dW_lecture.T)

# %% [markdown]
# ### The model: one flat parameter buffer
#
# `MLP` keeps every weight and bias in `mlp.params`; `mlp.layers[i].W` and `.b` are views
# into it, and `loss_and_grad` returns the gradient as one buffer of the same layout. The
# output layer is linear; the loss is softmax + cross-entropy, whose output error
# simplifies to $\delta^L = (\mathrm{softmax}(z^L) - \mathrm{onehot}(y)) / n$.

# %%
mlp = MLP([64, 32, 10], activation="relu", seed=0)
print(mlp)
for layer in mlp.layers:
    print(f"layer {layer.index}: W {layer.W.shape}, b {layer.b.shape}, params[{layer.span.start}:{layer.span.stop}], "
          f"a view: {np.shares_memory(layer.W, mlp.params)}")
loss, grad = mlp.loss_and_grad(digits.X_train[:32], digits.y_train[:32])
print(f"loss {loss:.3f} (ln 10 = {np.log(10):.3f} for a random guess); grad: {grad.shape} {grad.dtype}")
assert all(np.shares_memory(layer.W, mlp.params) for layer in mlp.layers)
assert np.log(10) - 0.5 < loss < 2 * np.log(10) and grad.shape == mlp.params.shape == (64 * 32 + 32 + 32 * 10 + 10,)

# %% [markdown]
# ## 2. Gradient check
#
# A backward pass with a bug still "trains" a little, so never trust one untested. Central
# differences $\big(C(w+\varepsilon e_i) - C(w-\varepsilon e_i)\big)/2\varepsilon$ approximate
# each partial derivative with error $O(\varepsilon^2)$; in float64 a correct gradient
# agrees to about $10^{-6}$ relative or better, a wrong one is off by order 1.

# %% tags=["nbval-ignore-output"]
for activation in ("relu", "sigmoid", "tanh"):
    result = gradcheck(MLP([64, 16, 10], activation, seed=1), digits.X_train[:16], digits.y_train[:16])
    print(f"{activation:>8}: {result}")
    assert result.passed

# %% [markdown]
# ## 3. Training on the digits
#
# scikit-learn's 8×8 handwritten digits (1,347 training and 450 test images, standardized
# pixels). Mini-batch SGD: every epoch shuffles the training set, then for each batch
# computes the flat gradient and steps $w \leftarrow w - \eta\, g$. The plot (a widget)
# redraws after every epoch: `train` calls it with the history so far.

# %%
model = MLP([64, 64, 10], seed=0)
live = LivePlot("64-64-10, relu, lr 0.1, batch 32")
live
# %%
history = train(model, digits.X_train, digits.y_train, epochs=20, batch_size=32, lr=0.1,
                X_test=digits.X_test, y_test=digits.y_test, callback=live)
live(history, force=True)  # draw the final state (the plot skips redraws closer than 0.5 s)

# %% tags=["nbval-ignore-output"]
print(f"test accuracy {history.test_accuracy[-1]:.1%} after {history.epochs} epochs, "
      f"{len(history.step_loss)} SGD steps in {history.seconds:.2f} s")
assert history.test_accuracy[-1] >= 0.95
assert len(history.step_loss) == history.epochs * -(-len(digits.X_train) // 32)  # 20 x ceil(1347 / 32)

# %% [markdown]
# How large can the learning rate be? The same 20 epochs at three rates:

# %% tags=["nbval-ignore-output"]
runs = {}
for lr in (0.1, 1.0, 3.0):
    with np.errstate(all="ignore"):  # an overflowing loss is the point of the last one
        runs[lr] = train(MLP([64, 64, 10], seed=0), digits.X_train, digits.y_train, epochs=20, batch_size=32,
                         lr=lr, X_test=digits.X_test, y_test=digits.y_test)
    h = runs[lr].step_loss
    print(f"lr {lr:<4}: largest step loss {np.nanmax(h):10.3g}, final loss {h[-1]:8.3g}, "
          f"test accuracy {runs[lr].test_accuracy[-1]:.1%}")

# %%
worst = {lr: np.nanmax(r.step_loss) for lr, r in runs.items()}
assert runs[0.1].test_accuracy[-1] >= 0.95 and worst[0.1] < 10                     # smooth
assert worst[1.0] > 10 * worst[0.1] and runs[1.0].test_accuracy[-1] >= 0.8         # spikes, recovers
assert not np.isfinite(runs[3.0].step_loss[-1]) and runs[3.0].test_accuracy[-1] < 0.2  # diverges
print("PASS: lr 0.1 smooth; lr 1 spikes then recovers; lr 3 diverges to NaN at chance accuracy")

# %% [markdown]
# At 0.1 the loss falls smoothly. At 1 it is on the edge: early steps overshoot and the loss
# jumps more than tenfold above anything lr 0.1 ever shows, yet the network recovers. At 3 the
# weights blow up: the loss overflows to NaN, and the accuracy falls to that of a guess
# (about 10 %).
#
# ### Your turn: the panel
#
# Move the sliders and press **Run**. Things to try: learning rates of 1 and 3 (the panel
# says when training diverges) and of 0.001 (crawling); 4 hidden units; sigmoid against
# relu at the same learning rate; batch 8 against batch 256 for the same number of epochs
# (more, noisier steps against fewer, smoother ones — chapter 3 comes back to this); the
# two ends of the batch slider, 1 (SGD) and all 1347 rows (full-batch gradient descent,
# one update per epoch), which section 3.1 compares.

# %%
panel = BackpropPanel()
panel

# %% tags=["nbval-ignore-output"]
panel.run()  # the same as pressing Run: the default settings
print(panel.status.value)

# %% [markdown]
# ### 3.1 Full-batch gradient descent, SGD and mini-batch SGD
#
# The lecture's gradient descent computes $L(D, w)$ over the **whole** data set for every
# update: one update per pass. Mini-batch SGD shuffles $D$, splits it into batches of $b$
# rows and updates after each: an epoch makes $S = \lceil n/b \rceil$ updates. $b = 1$ is
# stochastic gradient descent (SGD), $b = n$ full-batch gradient descent (GD). The forward
# pass keeps every layer's activations for the backward pass, so a step holds
# $b \cdot (n_0 + n_1 + \dots + n_L)$ numbers: memory grows with $b$ while the updates per
# epoch fall as $1/b$. The three on the digits (64-32-10 relu, float64, 10 epochs, the same
# initial weights; the rate follows chapter 3's square-root rule, $0.1\sqrt{b/32}$):

# %%
from coursekit.nn.batch_size import BatchConfig, compare_batch_sizes, updates_per_epoch

n_train = len(digits.X_train)
batch_config = BatchConfig(batch_sizes=(1, 32, n_train), epochs=10)
batch_runs = {run.batch_size: run for run in compare_batch_sizes(batch_config, digits)}
method = {1: "SGD, b = 1", 32: "mini-batch, b = 32", n_train: f"full-batch GD, b = {n_train}"}
print(f"{'':24}{'rate':>6}{'updates/epoch':>15}{'activations/step':>18}{'loss after 10 epochs':>22}")
for b, run in batch_runs.items():
    print(f"{method[b]:24}{run.lr:>6.3f}{run.updates_per_epoch:>15,}{run.activation_bytes:>12,} bytes"
          f"{'≈' + format(run.loss[-1], '.2g'):>22}")
for b, run in batch_runs.items():
    assert run.updates_per_epoch == updates_per_epoch(n_train, b) == -(-n_train // b)
    assert run.activation_bytes == b * sum((64, 32, 10)) * 8  # b x sum(widths) x itemsize
sgd, mini, full = (batch_runs[b] for b in (1, 32, n_train))
assert sgd.loss[-1] < mini.loss[-1] < full.loss[-1]
assert sgd.loss[0] < full.loss[-1]
print("PASS: updates per epoch = ceil(n / b) and activation bytes = b x 106 x 8, exactly; after the same "
      "10 epochs SGD's loss < mini-batch's < GD's, and SGD's first epoch beats GD's ten")

# %% [markdown]
# Per epoch, more updates win: ten GD steps do less than one epoch of SGD. But an epoch of
# SGD is 1,347 tiny steps, each paying Python's and the kernels' call overhead, while GD's
# single step is one large, efficient product. The wall-clock view (this machine, one
# thread; noise can reorder close times, so only the cost per update, which differs by
# orders of magnitude, is asserted):

# %% tags=["nbval-ignore-output"]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), layout="constrained")
epochs_axis = np.arange(1, batch_config.epochs + 1)
for i, (b, run) in enumerate(batch_runs.items()):
    axes[0].semilogy(epochs_axis, run.loss, "o-", color=series_color(i), label=method[b])
    axes[1].loglog(run.seconds, run.loss, "o-", color=series_color(i), label=method[b])
axes[0].set(xlabel="epoch", ylabel="training loss", title="loss against epochs")
integer_ticks(axes[0])
axes[1].set(xlabel="wall time [s]", ylabel="training loss", title="loss against wall time")
legend_outside(axes[1])
show()
per_update = {b: run.seconds[-1] / (run.updates_per_epoch * batch_config.epochs) for b, run in batch_runs.items()}
for b, run in batch_runs.items():
    print(f"{method[b]:24}: {run.seconds[-1] / batch_config.epochs * 1e3:7.1f} ms per epoch, "
          f"{per_update[b] * 1e6:9.1f} us per update")
assert per_update[n_train] > 10 * per_update[1]
print("PASS: a full-batch update costs more than 10 SGD updates")

# %% [markdown]
# ### 3.2 Train, validation, test
#
# `load_digits` gives a training and a test set. To **choose** a setting (here the hidden
# width) we must not look at the test set, or its accuracy stops being an honest estimate
# of the accuracy on new data. The lecture's workflow: hold a validation set out of the
# training set (`coursekit.data.validation_split`: 20 % of each class), fit one network
# per setting on the rest, pick the setting with the best validation accuracy, and report
# the test accuracy of that one network, once.

# %%
from coursekit.data import validation_split
from coursekit.nn.model_selection import ValidationConfig, validation_curve

val_config = ValidationConfig(widths=(1, 2, 4, 8, 16, 32, 64), epochs=10)
curve = validation_curve(val_config, digits)
held_out = sum(round(0.2 * np.sum(digits.y_train == c)) for c in range(10))
print(f"fit on {curve.n_fit} rows, validate on {curve.n_val}; the test set's {len(digits.X_test)} rows are "
      f"used once")
assert curve.n_val == held_out and curve.n_fit + curve.n_val == n_train

# %% tags=["nbval-ignore-output"]
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.semilogx(val_config.widths, curve.train_accuracy, "o-", color=series_color(0), label="training (fit) rows")
ax.semilogx(val_config.widths, curve.val_accuracy, "o-", color=series_color(1), label="validation rows")
ax.axvline(curve.chosen, color="gray", ls=":", lw=1)
ax.set(xlabel="hidden width", ylabel="accuracy", title="validation curve: 64-width-10, 10 epochs")
ax.set_xticks(val_config.widths, [str(w) for w in val_config.widths])
legend_outside(ax)
show()
for w, fit, val in zip(val_config.widths, curve.train_accuracy, curve.val_accuracy):
    print(f"width {w:>2}: training {fit:6.1%}, validation {val:6.1%}")
print(f"chosen on validation: width {curve.chosen}; its test accuracy {curve.test_accuracy:.1%}")
best = int(np.argmax(curve.val_accuracy))
assert curve.chosen == val_config.widths[best]
assert curve.val_accuracy[0] < 0.5 and curve.val_accuracy[best] >= 0.93
assert np.all(np.diff(curve.val_accuracy[:4]) > 0) and np.ptp(curve.val_accuracy[-3:]) < 0.03  # climbs, levels off
assert abs(curve.test_accuracy - curve.val_accuracy[best]) < 0.05
print("PASS: the chosen width is the validation argmax; width 1 underfits (< 50 %), accuracy climbs to "
      "width 8 and the widest three are within 3 points; the chosen network's test accuracy is within 5 "
      "points of its validation accuracy")

# %% [markdown]
# One hidden unit cannot separate ten digits; accuracy climbs with the width and levels off.
# Among the widths that level off, the differences are a few validation images (1 image
# = 0.4 %), so the chosen width can move with the seed; the test accuracy, measured once,
# stays close to the validation accuracy that chose it.
#
# ### 3.3 Do small batches generalize better?
#
# Some argue for small batches (the Russian deck; Keskar et al. 2017: large batches settle
# in sharp minima that generalize worse). The measure is the **generalization gap**,
# training accuracy minus test accuracy. Batch 8 against batch 256, the same 20 epochs,
# the rate scaled with the batch by chapter 3's linear rule ($0.1 \cdot b/32$: 0.025 and
# 0.8), three seeds each:

# %%
gaps = {8: [], 256: []}
for seed in range(3):
    for run in compare_batch_sizes(BatchConfig(batch_sizes=(8, 256), epochs=20, lr_rule="linear", seed=seed),
                                   digits):
        gaps[run.batch_size].append(run)

# %% tags=["nbval-ignore-output"]
for b, runs_b in gaps.items():
    print(f"batch {b:>3}: training accuracy " + " ".join(f"{r.train_accuracy:.1%}" for r in runs_b)
          + ", test " + " ".join(f"{r.test_accuracy:.1%}" for r in runs_b)
          + ", gap " + " ".join(f"{r.gap:.1%}" for r in runs_b))
mean_gap = {b: np.mean([r.gap for r in runs_b]) for b, runs_b in gaps.items()}
spread = max(r.gap for runs_b in gaps.values() for r in runs_b) - min(r.gap for runs_b in gaps.values() for r in runs_b)
print(f"mean gap: batch 8 {mean_gap[8]:.1%}, batch 256 {mean_gap[256]:.1%}; "
      f"gaps range over {spread:.1%} across all six runs")
assert all(r.train_accuracy >= 0.99 for runs_b in gaps.values() for r in runs_b)
assert abs(mean_gap[8] - mean_gap[256]) < spread
print("PASS: both batch sizes fit the training set (>= 99 %), and the difference of their mean gaps "
      "is smaller than the spread of the gaps across seeds")

# %% [markdown]
# **The digits do not show it.** Both batch sizes fit the training set almost perfectly,
# and their gaps differ by less than the seeds alone move them. The effect reported for
# large batches needs larger models and data sets (ImageNet-scale networks, batches of
# thousands), where it is also contested: with the rate scaled and warmed up, batches of
# 8,192 images train ResNet-50 to the small-batch accuracy (Goyal et al. 2017; chapter 7).
# What the digits do show is in 3.1: per epoch, small batches make more progress.

# %% [markdown]
# ## 4. How fast is a training step?
#
# The same SGD step — forward, backward, update, same weights, same batch — in up to four
# implementations, all on **one thread**: coursekit's Numba kernels
# (`coursekit.nn.kernels_cpu`: the whole network in one compiled call, BLAS for the matrix
# products, every elementwise step fused into one loop); the **tight NumPy** step a
# competent user writes (buffers allocated once, `np.dot(..., out=)`, in-place activations,
# the softmax gradient fused: `coursekit.nn.speed.TightNumpyStep`); the readable NumPy
# reference above; and PyTorch eager if it is installed. A step of a 784-256-10 network on a
# batch of 256 costs 2 · 256 · (784·256 + 256·10) ≈ 104 MFLOP forward, and backward
# about the same, not twice: backward repeats each layer's product twice (the weight
# gradient $A^T\delta$ and the input gradient $\delta W^T$), but the first layer's input
# gradient is a gradient with respect to the data, which training never needs, and that
# layer holds 98.7 % of the work. So a step is ≈ 2 × forward ≈ 209 MFLOP
# (`flops.mlp_step_flops`); the "3 × forward" rule of §5 holds for deep networks. The
# readable reference computes that unneeded $\delta W^T$ anyway (`layer_backward` returns it
# for every layer): its row counts the ≈ 312 MFLOP it really does
# (`mlp_step_flops(..., first_input_grad=True)`). Dividing by the time gives GFLOP/s, which
# we compare with this machine's single-thread matrix-product peak (a 512 x 512 product),
# measured right here in the same rounds. Every time is the best of many short windows of 2 ms: on a busy machine most
# such windows still run undisturbed, while a long window almost always shares the core.

# %%
step_work = flops.mlp_step_flops((784, 256, 10), 256)
reference_work = flops.mlp_step_flops((784, 256, 10), 256, first_input_grad=True)
first_share = 784 * 256 / (784 * 256 + 256 * 10)
print(f"forward {step_work['forward'] / 1e6:.0f} MFLOP, backward {step_work['backward'] / 1e6:.0f} MFLOP "
      f"({step_work['backward'] / step_work['forward']:.2f} x forward), step {step_work['total'] / 1e6:.0f} MFLOP; "
      f"with the first layer's delta W^T (the reference): {reference_work['total'] / 1e6:.0f} MFLOP")
assert step_work["forward"] == 2 * 256 * (784 * 256 + 256 * 10)
assert round(first_share, 3) == 0.987
assert step_work["backward"] == 2 * step_work["forward"] - 2 * 256 * 784 * 256
assert 1.0 < step_work["backward"] / step_work["forward"] < 1.02 and round(step_work["total"] / 1e6) == 209
assert reference_work["total"] == 3 * reference_work["forward"] and round(reference_work["total"] / 1e6) == 312
print("PASS: backward is ~1x forward here (the first layer, 98.7 % of the work, needs no input gradient); "
      "the reference does 1.5x the step's work")

# %% tags=["nbval-ignore-output"]
from coursekit.nn.speed import best_time, measure_bandwidth, measure_matmul_peak, single_thread, training_steps

configs = {"64-128-10, batch 32": ((64, 128, 10), 32), "784-256-10, batch 256": ((784, 256, 10), 256)}
steps = {}
for label, (sizes, batch) in configs.items():
    X = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    steps[label] = training_steps(MLP(sizes, seed=0), X, rng.integers(0, sizes[-1], batch), lr=1e-3)
speed = {label: dict.fromkeys(contestants, np.inf) for label, contestants in steps.items()}
peak = 0.0
with single_thread():
    bandwidth = measure_bandwidth()
    for _ in range(5):  # interleaved rounds, best of each
        peak = max(peak, measure_matmul_peak(512, repeats=30, min_seconds=0.002))
        for label, contestants in steps.items():
            for name, step in contestants.items():
                speed[label][name] = min(speed[label][name], best_time(step, repeats=15, min_seconds=0.002))

print(f"this machine, one thread: matrix-product peak {peak / 1e9:.0f} GFLOP/s, memory copy {bandwidth / 1e9:.1f} GB/s\n")
print(f"{'':24}{'implementation':>19}{'steps/s':>10}{'GFLOP/s':>9}{'% of peak':>11}")
fraction = {}
for label, (sizes, batch) in configs.items():
    for name, seconds in speed[label].items():
        # the work each one really does: only the reference computes the first layer's delta W^T
        work = flops.mlp_step_flops(sizes, batch, first_input_grad=name == "numpy (reference)")["total"]
        fraction[label, name] = work / seconds / peak
        print(f"{label:24}{name:>19}{1 / seconds:>10,.0f}{work / seconds / 1e9:>9.1f}{fraction[label, name]:>10.0%}")
print("\nNumba's step is faster than tight NumPy's by "
      + ", ".join(f"{speed[label]['numpy (tight)'] / speed[label]['numba']:.2f}x ({label})" for label in configs))

# %% tags=["nbval-ignore-output"]
from matplotlib.ticker import EngFormatter, MaxNLocator

fig, axes = plt.subplots(1, 2, figsize=(10, 3), layout="constrained")
for ax, (label, times) in zip(axes, speed.items()):
    ax.barh(list(times), [1 / t for t in times.values()], color=[series_color(i) for i in range(len(times))])
    ax.set(title=label, xlabel="training steps per second (1 thread)")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=4))  # a few short labels ("10k") at any speed
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.invert_yaxis()
show()

# %%
small, large = configs
gap = {label: speed[label]["numpy (tight)"] / speed[label]["numba"] for label in configs}
assert all(speed[small]["numba"] < t for name, t in speed[small].items() if name != "numba")
assert gap[small] > gap[large]
assert fraction[large, "numba"] >= 0.5
assert max(fraction.values()) <= 1.1, "a step cannot beat the matrix-product peak: the peak was disturbed, run again"
# counted by the work it really does, the reference runs near tight NumPy's fraction of the peak:
# it is slower from its extra 50 % of FLOPs, not from overhead
assert fraction[large, "numpy (reference)"] >= 0.7 * fraction[large, "numpy (tight)"]
print("PASS: on the small net Numba is the fastest; the gap to tight NumPy shrinks on the large one, "
      "where Numba runs at half the peak or more, and the reference, counted by the FLOPs it does, "
      "near tight NumPy")

# %% [markdown]
# On the small network the matrix products are tiny, and the time goes to the *overhead
# around them*: every NumPy or PyTorch operation is a Python call with its own checks and
# dispatch, the readable reference also allocates a temporary for every bias, activation
# and derivative, while the Numba version makes one call. Writing NumPy tightly removes the
# temporaries but not the calls, so Numba still wins there, by the factor printed above.
# On the large one the products dominate; all
# implementations call a BLAS matrix product, the gap to tight NumPy shrinks, and Numba runs
# at half the machine's peak or more. The readable reference is slower there mostly because
# it does more arithmetic (the first layer's unneeded $\delta W^T$, 1.5 × the step's FLOPs),
# not from overhead: counted by the FLOPs it really does, its fraction of the peak comes
# close to tight NumPy's (the check above asserts at least 70 % of it). The lecture's point: neural-network training is
# mostly matrix products, so **FLOPs decide the time**.
#
# ## 5. The lecture's CNN workloads
#
# Multiply-accumulates (MACs, 2 FLOPs each) of **one forward pass of one image** for six
# well-known networks (Sze et al. 2017, as on the slide). In these deep networks every layer
# but the first needs its input gradient, so backward costs about twice the forward pass
# and training about 3 × forward (the shallow MLP of §4 is the exception: ≈ 2 ×).

# %%
def si(x):
    """341000 -> '341k', 2.8e9 -> '2.8G'."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


print(f"{'network':<14}{'input':>7}{'conv MACs':>11}{'FC MACs':>10}{'total MACs':>12}{'weights':>9}"
      f"{'training FLOPs/image':>22}")
for w in flops.CNN_WORKLOADS.values():
    print(f"{w.name:<14}{w.input_size:>7}{si(w.conv_macs):>11}{si(w.fc_macs):>10}{si(w.total_macs):>12}"
          f"{si(w.total_weights):>9}{si(flops.training_flops_per_sample(w.total_macs)):>22}")

# %% [markdown]
# One slip on the slide: the FC MACs of Overfeat fast and VGG 16 are swapped (124M and
# 130M). At batch 1 a fully connected layer uses each weight in exactly one MAC, so its
# MACs equal its weights, and the layer widths confirm it:

# %%
print(f"VGG 16 FC layers {flops.VGG16_FC}: {flops.dense_macs(flops.VGG16_FC) / 1e6:.1f}M MACs")
print(f"Overfeat fast FC layers {flops.OVERFEAT_FAST_FC}: {flops.dense_macs(flops.OVERFEAT_FAST_FC) / 1e6:.1f}M MACs")
assert round(flops.dense_macs(flops.VGG16_FC) / 1e6, 1) == 123.6 and round(flops.dense_macs(flops.OVERFEAT_FAST_FC) / 1e6, 1) == 129.9
assert flops.CNN_WORKLOADS["VGG 16"].fc_macs == 130e6 and flops.CNN_WORKLOADS["Overfeat fast"].fc_macs == 124e6  # the slip

# %% [markdown]
# ### Work per layer type
#
# The lecture's second table gives the work of one iteration per layer type, for a
# mini-batch of $N$ images of $C$ channels of $H \times W$ pixels: activation, pooling and
# batch norm are $O(NCHW)$ for each of $y$, $\partial w$ and $\partial x$ (pooling has no
# weights); a fully connected layer is $C_{out} C_{in} N$ MACs for each; a direct
# convolution with $K_x \times K_y$ kernels is $N C_{out} C_{in} H' W' K_x K_y$ for $y$ and
# $\partial w$, and the table writes $N C_{out} C_{in} H W K_x K_y$ for $\partial x$
# (`coursekit.nn.layer_work`, the formulas in its docstring). For one 3×3 layer of ResNet-50's
# second stage (64 channels, 56×56) at $N = 32$, the layers around it, and its last FC layer:

# %%
from coursekit.nn import layer_work
from coursekit.sim import resnet50

N = 32
table = [layer_work.conv_work(N, 64, 64, 56, 56, 3, 3)] + [
    layer_work.elementwise_work(kind, N, 64, 56, 56) for kind in layer_work.ELEMENTWISE] + [
    layer_work.fc_work(N, 2048, 1000)]
print(f"{'layer':<18}{'y':>8}{'dw':>8}{'dx':>8}")
for row in table:
    print(f"{row.layer:<18}{si(row.y):>8}{si(row.dw) if row.dw else '-':>8}{si(row.dx):>8}")
conv, fc = table[0], table[-1]
assert conv.y == conv.dw == conv.dx == N * 64 * 64 * 56 * 56 * 3 * 3  # stride 1, same padding: H'W' = HW
assert conv.y == 64 * 3 * 3 * table[1].y  # C_in Kx Ky = 576 MACs per output element
assert fc.y == fc.dw == fc.dx == N * 2048 * 1000
print("PASS: the rows equal the table's formulas; the convolution does 576x the work of each elementwise layer")

# %% [markdown]
# Checked against chapter 1's counts: the fully connected rows, summed over the layers of
# §4's 784-256-10 network (without the first layer's $\partial x$, which training never needs),
# are exactly the step FLOPs of `flops.mlp_step_flops` (2 FLOPs per MAC); the convolution
# rows at $N = 1$ are the per-image MACs of ResNet-50's layers in `coursekit.sim.resnet50`,
# strided ones included. For a strided layer the table's $\partial x$ (input size $H W$) is
# $s^2$ times its $y$: the direct loop visits every input pixel and kernel tap, although only
# $1/s^2$ of those pairs meet a stride position.

# %%
for first in (False, True):
    fc_layers = [layer_work.fc_work(256, a, b) for a, b in ((784, 256), (256, 10))]
    macs = layer_work.training_macs(fc_layers, first_input_grad=first)
    assert {k: 2 * v for k, v in macs.items()} == flops.mlp_step_flops((784, 256, 10), 256, first_input_grad=first)
layer_macs = {layer.name: layer.macs for layer in resnet50.layers()}
conv1 = layer_work.conv_work(1, 3, 64, 224, 224, 7, 7, stride=2)
checked = {"conv1": conv1, "conv2_1b": layer_work.conv_work(1, 64, 64, 56, 56, 3, 3),
           "conv3_1a": layer_work.conv_work(1, 256, 128, 56, 56, 1, 1, stride=2),
           "fc": layer_work.fc_work(1, 2048, 1000)}
for name, work in checked.items():
    assert work.y == layer_macs[name], name
    print(f"ResNet-50 {name:<9}: y {si(work.y):>6} MACs = coursekit.sim.resnet50; table's dx {si(work.dx):>6}")
assert conv1.dx == 4 * conv1.y
print(f"PASS: FC rows = flops.mlp_step_flops for 784-256-10 at batch 256 ({2 * macs['total'] / 1e6:.0f} MFLOP with "
      "the first dx); conv rows = ResNet-50's layer MACs; stride 2 makes the table's dx 4x y")

# %% [markdown]
# ## 6. The least time ResNet-50 can take
#
# ResNet-50: 3.9 GMACs forward, so about 11.7 GMACs forward + backward = 23.4 GFLOP per
# image. ImageNet-2012 has 1.28 M training images and a usual schedule is 90 epochs. An
# NVIDIA V100 peaks at about 112 TFLOP/s (fp16 tensor cores). If every FLOP ran at peak:

# %%
run = flops.RESNET50_IMAGENET
t_min = flops.minimum_training_time(run, 112e12)
t_real = flops.time_at_throughput(run, 1457)
print(f"per image  : {run.flops_per_sample / 1e9:.1f} GFLOP")
print(f"per epoch  : {run.flops_per_epoch / 1e12:,.0f} TFLOP")
print(f"90 epochs  : {run.total_flops / 1e18:.2f} EFLOP")
print(f"minimum    : {t_min:,.0f} s = {t_min / 3600:.1f} h on one V100 at 112 TFLOP/s")
print(f"measured   : MXNet, 1,457 images/s -> {t_real:,.0f} s = {t_real / 3600:.1f} h "
      f"({run.total_flops / t_real / 112e12:.0%} of peak)")
assert np.isclose(t_min, run.total_flops / 112e12) and round(t_min) == 24_069
assert np.isclose(t_real, run.samples * run.epochs / 1457) and round(t_real) == 79_067
assert round(run.total_flops / t_real / 112e12, 2) == 0.30

# %% tags=["nbval-ignore-output"]
years = flops.minimum_training_time(run, peak) / (3600 * 24 * 365)
print(f"on one core of this machine at its measured peak ({peak / 1e9:.0f} GFLOP/s): {years:.1f} years")
assert np.isclose(years, run.total_flops / peak / (3600 * 24 * 365))

# %% [markdown]
# Even the ideal is most of a working day on the fastest GPU of its time, and the real
# run reaches about 30 % of it. That is why the rest of the course spreads the work over
# many GPUs — and why chapter 7 returns to ResNet-50 on 1,024 of them.
#
# ## 7. Why GPUs: a roofline
#
# A kernel that does $F$ FLOPs while moving $B$ bytes has **arithmetic intensity**
# $I = F/B$. A device with peak $P$ FLOP/s and memory bandwidth $\beta$ B/s can at best
# reach $\min(P, \beta I)$: memory-bound left of the ridge $I = P/\beta$, compute-bound
# right of it. A GPU has thousands of simple cores (high $P$) *and* much higher memory
# bandwidth. Elementwise work sits far left on every device; a large matrix product (4096³,
# each number reused thousands of times) sits right of every ridge. Our training-sized
# 256×784×256 product (55 FLOP/B in fp32) is compute-bound on a CPU core but *left* of the
# V100's tensor-core ridge (112e12 / 900e9 ≈ 124 FLOP/B): memory-bound there, even with
# 2-byte fp16 operands (110 FLOP/B). Careful with that line: 112 TFLOP/s is the fp16
# tensor-core peak of the PCIe card (SXM2: 125), while the intensities here assume 4-byte
# fp32 operands; at the V100's fp32 peak (14 TFLOP/s, ridge ≈ 16) the same product is
# compute-bound. To keep a GPU busy, products must be large: big batches and wide layers.

# %% tags=["nbval-ignore-output"]
devices = list(flops.HARDWARE.values()) + [flops.Hardware("this machine, 1 core (measured)", peak, bandwidth)]
intensity = np.logspace(-2, 3, 200)
fig, ax = plt.subplots(figsize=(7.5, 4.5))
for h in devices:
    ax.loglog(intensity, [flops.attainable_flops(h, i) / 1e9 for i in intensity], label=h.name)
kernels = {
    "elementwise (relu)": 1 / 8,
    "matmul 32x64x128": flops.matmul_intensity(32, 64, 128),
    "matmul 256x784x256": flops.matmul_intensity(256, 784, 256),
    "matmul 4096^3": flops.matmul_intensity(4096, 4096, 4096),
}
for name, i in kernels.items():
    ax.axvline(i, color="gray", lw=0.6, ls=":")
    ax.text(i * 1.08, 2, name, rotation=90, fontsize=8, va="bottom")
ax.set(xlabel="arithmetic intensity [FLOP/byte]", ylabel="attainable GFLOP/s", ylim=(1, 3e5),
       title="roofline: min(peak, bandwidth x intensity)")
legend_outside(ax)
show()

# %%
tensor, fp32 = flops.HARDWARE["NVIDIA V100 PCIe (fp16 tensor cores)"], flops.HARDWARE["NVIDIA V100 PCIe (fp32)"]
mid = kernels["matmul 256x784x256"]
print(f"256x784x256: {mid:.0f} FLOP/B (fp32), {flops.matmul_intensity(256, 784, 256, itemsize=2):.0f} (fp16); "
      f"V100 ridges: tensor cores {tensor.ridge:.0f}, fp32 {fp32.ridge:.0f}; "
      f"4096^3: {kernels['matmul 4096^3']:.0f} FLOP/B")
assert fp32.ridge < mid < flops.matmul_intensity(256, 784, 256, itemsize=2) < tensor.ridge
assert all(kernels["elementwise (relu)"] < h.ridge < kernels["matmul 4096^3"] for h in devices)
assert mid > devices[-1].ridge, "this core's ridge (measured peak / copy bandwidth) should lie left of 55 FLOP/B"
print("PASS: 256x784x256 is memory-bound on the V100's tensor cores, compute-bound in its fp32 "
      "and on this core; relu is left of every ridge, 4096^3 right of every one")

# %% [markdown]
# ## 8. The same kernels on a GPU
#
# `MLP(..., device="cuda")` runs forward and backward with `coursekit.nn.kernels_cuda`: a
# **register-blocked tiled matrix product** (a block of 16×16 threads computes a 64×64 tile
# of the output; it stages 64×16 slabs of both inputs in fast shared memory, and each
# thread keeps a 4×4 piece of the output in registers, so every number loaded from global
# memory is reused 64 times) with bias + activation applied before the one store, and small
# kernels for $\delta = G \odot \sigma'$, the bias gradient and softmax + cross-entropy.
# `device="auto"` picks the GPU when numba finds one; on a cluster each engine uses the GPU
# of its local rank, and chapters 3-6 and 8 take the same `device` in their configs. Without
# a GPU the tests run the kernels in numba's CUDA simulator and compare them with the CPU
# results; `make test-gpu` measures them on a real one (README, "On GPUs": on an H200 the
# product reaches 40-58 % of cuBLAS, yet a step of these small networks is slower than on
# one CPU core, because every kernel launch from Python costs tens of microseconds).

# %% tags=["nbval-ignore-output"]
from coursekit.nn.mlp import resolve_device

device = resolve_device("auto")
print("device='auto' resolves to:", device)
if device == "cuda":
    X, y = digits.X_train[:256], digits.y_train[:256]
    for dev in ("cpu", "cuda"):
        m = MLP([64, 512, 10], device=dev, seed=0)
        t = best_time(lambda: m.loss_and_grad(X, y))
        print(f"{dev}: {t * 1e6:.0f} us per loss_and_grad (includes host <-> device copies)")

# %% [markdown]
# ## Summary
#
# * Backpropagation is the chain, product and sum rules applied from the loss backwards:
#   three matrix products and two elementwise steps per layer; a gradient check against
#   central differences catches any slip, intermediate by intermediate.
# * A step against the gradient changes the loss by about $-r\lVert\nabla L\rVert^2$: always
#   down for a small rate, up once the rate outgrows the loss's curvature.
# * Small batches make more updates per epoch and hold fewer activations per step; full
#   batches make fewer, costlier updates. Settings are chosen on a validation set, the test
#   set is used once; on the digits, small batches do not generalize measurably better.
# * The parameters and the gradient are **one flat buffer** — in chapter 3 data-parallel
#   workers will average exactly this buffer with one allreduce.
# * For small networks, overhead per operation dominates: compiling the whole step
#   (Numba) beats even a tightly written NumPy step, by the factor §4 printed and asserts
#   above 1 (1.5–2 × on the machines these notes were built on), and the readable NumPy and
#   PyTorch eager by more. For large ones everything is matrix products, and the only way
#   to go faster is more FLOP/s: GPUs, then many GPUs.
#
# Exercises: `exercises/01_backprop.ipynb` — write `layer_backward` yourself;
# `exercises/01_chain_rule.ipynb` — derive the two-layer backward pass of a sigmoid network
# with the quadratic cost from the chain rule, checked against finite differences.
