# %% [markdown]
# # Exercise 05 · The 1F1B pipeline schedule
#
# A pipeline schedule is data: for every rank $r$ an ordered list of compute actions, each
# named by what it computes: `F(s, i)` (forward of stage $s$ on micro-batch $i$) and
# `B(s, i)` (its full backward: the input gradient that stage $s-1$ waits for and the weight
# gradient). Zero-bubble schedules split B into `I(s, i)` (input gradient only) and a later
# `W(s, i)` (weight gradient only); 1F1B does not, and the check says so if a schedule uses
# another letter. Here rank $r$ holds stage $r$, so rank $r$'s list only contains `F(r, i)`
# and `B(r, i)`.
# `Schedule.from_compute` adds the sends and receives between neighbouring ranks, the
# validator rejects impossible orders (a backward before its forward, a deadlock), and
# `simulate` plays the schedule to give its time, its idle ("bubble") fraction and the peak
# number of micro-batches whose activations each rank keeps.
#
# GPipe, as an example of the format: every rank runs the forwards of all $m$
# micro-batches, then all their backwards.

# %%
import matplotlib.pyplot as plt
import numpy as np

from coursekit.grading.ch05 import check_one_f_one_b
from coursekit.parallel.pipeline import B, F, Schedule, simulate
from coursekit.viz import legend_outside, show
from coursekit.viz.pipeline import plot_schedule


def gpipe(stages, microbatches):
    """GPipe: rank r runs F(r, 0) ... F(r, m-1), then B(r, m-1) ... B(r, 0)."""
    return [[F(r, i) for i in range(microbatches)] + [B(r, i) for i in reversed(range(microbatches))]
            for r in range(stages)]


for r, actions in enumerate(gpipe(2, 3)):
    print(f"rank {r}:", " ".join(map(str, actions)))  # F0.1 = forward of stage 0 on micro-batch 1

# %% [markdown]
# GPipe idles $(p-1)(T_F + T_B)$ on every rank, a bubble fraction of $\frac{p-1}{m+p-1}$,
# but every rank keeps the activations of all $m$ micro-batches until its backwards start.
#
# **1F1B** (PipeDream-Flush) has the same bubble and keeps at most $p - r$ micro-batches on
# rank $r$. Rank $r$ of $p$, with $m \ge p$ micro-batches:
#
# 1. **warm-up**: the forwards of the first $w = p - 1 - r$ micro-batches (the last rank has
#    none: it can start a backward as soon as a forward is done);
# 2. **steady state**: $m - w$ times, the forward of the next micro-batch, then the
#    backward of the oldest micro-batch that has not had one;
# 3. **cool-down**: the backwards of the $w$ micro-batches that are left.
#
# Micro-batches go in order: forwards 0, 1, 2 ..., backwards 0, 1, 2 ... For $p = 2$,
# $m = 3$ this gives rank 0: `F0.0 F0.1 B0.0 F0.2 B0.1 B0.2`, rank 1:
# `F1.0 B1.0 F1.1 B1.1 F1.2 B1.2`.
#
# Write `one_f_one_b`, then run the check below it: it adds the messages, validates and
# simulates your schedule for several $(p, m)$ and compares the bubble with
# $\frac{p-1}{m+p-1}$ and the memory with $p - r$.

# %%
def one_f_one_b(stages, microbatches):
    """1F1B: for each rank r, its list of F(r, i) / B(r, i) in the order it runs them."""
    # Hint: warm-up forwards, then alternate one F and one B, then the remaining Bs
    ### BEGIN SOLUTION
    out = []
    for r in range(stages):
        warm = min(stages - 1 - r, microbatches)
        acts = [F(r, i) for i in range(warm)]
        for i in range(microbatches - warm):
            acts += [F(r, warm + i), B(r, i)]
        acts += [B(r, i) for i in range(microbatches - warm, microbatches)]
        out.append(acts)
    return out
    ### END SOLUTION


# %%
check_one_f_one_b(one_f_one_b)

# %% [markdown]
# ## Your schedule against GPipe
#
# Both schedules for $p = 4$ ranks and $m = 8$ micro-batches, with a full backward twice as
# long as a forward, as for a matrix-product layer: its input gradient and its weight
# gradient each cost one product as large as the forward ($T_F = T_I = T_W = 1$, so B lasts
# $T_I + T_W = 2$). The same time and bubble, half the memory on rank 0.

# %%
def as_schedule(name, compute, microbatches):
    """Per-rank compute lists -> a Schedule with the sends and receives added."""
    return Schedule.from_compute(name, compute, microbatches)


p, m = 4, 8
times = dict(t_f=1.0, t_i=1.0, t_w=1.0)  # B = I + W lasts 2
mine = simulate(as_schedule("your 1F1B", one_f_one_b(p, m), m), **times)
theirs = simulate(as_schedule("GPipe", gpipe(p, m), m), **times)
print(f"bubble (p-1)/(m+p-1) = {(p - 1) / (m + p - 1):.3f}")
for name, r in (("GPipe", theirs), ("your 1F1B", mine)):
    print(f"{name:10} time {r.total_time:g}, bubble {r.bubble_fraction:.3f}, "
          f"peak activations per rank {r.peak_activations.astype(int).tolist()}")
for r in (theirs, mine):  # (m + p - 1) slots of F + B = 1 + 2 time units
    assert np.isclose(r.bubble_fraction, (p - 1) / (m + p - 1)) and r.total_time == (m + p - 1) * 3
assert theirs.peak_activations.tolist() == [m] * p
assert mine.peak_activations.tolist() == [p - r for r in range(p)]
fig, axes = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
plot_schedule(theirs.timeline, ax=axes[0], title="GPipe")
plot_schedule(mine.timeline, ax=axes[1], title="your 1F1B")
show()

# %% [markdown]
# ## More micro-batches
#
# More micro-batches shrink the bubble of both schedules. GPipe pays for it in memory
# (rank 0 keeps all $m$); 1F1B does not (at most $p$).

# %%
ms = [4, 8, 16, 32, 64]
rows = []
for m in ms:
    r1 = simulate(as_schedule("your 1F1B", one_f_one_b(p, m), m), **times)
    rg = simulate(as_schedule("GPipe", gpipe(p, m), m), **times)
    rows.append((m, rg.bubble_fraction, r1.bubble_fraction, rg.peak_activations.max(), r1.peak_activations.max()))
print(f"{'m':>4}{'formula':>9}{'GPipe':>8}{'1F1B':>8}{'GPipe mem':>11}{'1F1B mem':>10}")
for m, bg, b1, mg, m1 in rows:
    print(f"{m:4d}{(p - 1) / (m + p - 1):9.3f}{bg:8.3f}{b1:8.3f}{mg:11g}{m1:10g}")
    assert np.allclose([bg, b1], (p - 1) / (m + p - 1)) and (mg, m1) == (m, p)

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
ax1.plot(ms, [r[1] for r in rows], "o-", label="GPipe")
ax1.plot(ms, [r[2] for r in rows], "x--", label="your 1F1B")
ax1.set(xscale="log", xlabel="micro-batches m", ylabel="bubble fraction", title=f"p = {p}")
ax2.plot(ms, [r[3] for r in rows], "o-", label="GPipe")
ax2.plot(ms, [r[4] for r in rows], "x--", label="your 1F1B")
ax2.set(xscale="log", xlabel="micro-batches m", ylabel="peak activations (micro-batches)")
for ax in (ax1, ax2):
    ax.set_xticks(ms, [str(m) for m in ms])  # one plain label per m, no minor log labels
    ax.minorticks_off()
legend_outside(ax2)
fig.tight_layout()
show()

# %% [markdown]
# ## It trains the same model
#
# The executor runs any valid schedule on ranks (here threads in this process), each rank
# holding its stage of the MLP and exchanging activations and gradients with its
# neighbours. The gradient of one pipelined step with your schedule equals the serial
# gradient of the whole batch.

# %%
from coursekit.data import load_digits
from coursekit.nn import MLP
from coursekit.parallel.pipeline import run_pipeline
from coursekit.cluster.runner import LocalRunner

digits = load_digits()
X, y = digits.X_train[:256].astype(np.float64), digits.y_train[:256]
mlp = MLP([64, 128, 128, 128, 10], dtype=np.float64, seed=0)  # 4 layers: one per rank
_, serial_grad = mlp.loss_and_grad(X, y)
run = run_pipeline(LocalRunner(4), as_schedule("your 1F1B", one_f_one_b(4, 8), 8), (X, y), mlp=mlp)
assert np.allclose(run.grad, serial_grad)
np.allclose(run.grad, serial_grad)
