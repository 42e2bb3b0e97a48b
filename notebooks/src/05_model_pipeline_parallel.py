# %% [markdown]
# # 05 · Model, tensor and pipeline parallelism
#
# Data parallelism (chapters 3 and 4) copies the whole model onto every worker and splits
# the **mini-batch**. When the model itself does not fit on one device we split the
# **model** instead:
#
# * every worker holds a part of the parameters and sees the **same** mini-batch;
# * the parts depend on each other, so activations travel between workers in the forward
#   pass and their gradients travel back in the backward pass. Where the neurons of one
#   layer connect to all neurons of the next across the split, every worker needs every
#   other worker's outputs: an all-to-all style exchange (an allgather or allreduce).
#
# (The Greek deck's model-parallelism slide is titled "parallelism at the level of input
# data", a title copied from its data-parallel slide: model parallelism splits the model,
# and every worker sees the whole input.)
#
# There are two ways to cut a network of fully connected layers:
#
# 1. **inside a layer** (tensor parallelism, Megatron-LM): each worker holds a slice of every
#    weight matrix;
# 2. **between layers** (a layer split): each worker holds a block of whole layers. Layers
#    run one after the other, so on its own this keeps only one worker busy at a time;
#    **pipeline parallelism** fixes that by cutting the mini-batch into micro-batches that
#    follow each other through the stages (GPipe, PipeDream, and their successors).
#
# Every experiment below runs on the engines of a local cluster and talks engine to engine
# through the Comm (chapter 2: shared-memory lanes between engines of one host); this notebook only sends the model and the data and draws. We
# start **two** engines: this course's reference machine has two CPU cores, and with more
# engines than cores the measured timings would show the engines queueing for a core more
# than the schedules. The simulations use any number of ranks.

# %%
import matplotlib.pyplot as plt
import numpy as np

from coursekit import cluster
from coursekit.comm.cluster_setup import setup_comm
from coursekit.data import load_digits
from coursekit.nn import MLP
from coursekit.parallel import traffic
from coursekit.parallel.pipeline import combine_ranks, schedule, simulate
from coursekit.cluster.runner import ClusterRunner
from coursekit.viz import show
from coursekit.viz.pipeline import plot_schedule

c = cluster.start(n=2)
setup_comm(c, backend="auto")  # a Comm on every engine, to every other engine
engines = ClusterRunner(c)  # runs fn(comm, ...) on the engines, as in every chapter
p = c.size  # ranks on the cluster
p

# %% [markdown]
# ## The model and the batch
#
# The chapter-1 MLP on the digits: 64 inputs, seven hidden layers of 512 units, 10 classes,
# so **8 layers** (they split into 1, 2, 4 or 8 equal blocks) and 1.6 million parameters.
# One training step uses a mini-batch of N = 512 images. We work in float64 so that every
# parallel result can be compared with the serial one to rounding error.

# %%
digits = load_digits()
X = digits.X_train[:512].astype(np.float64)
y = digits.y_train[:512]
mlp = MLP([64] + [512] * 7 + [10], activation="relu", dtype=np.float64, seed=0)
serial_loss, serial_grad = mlp.loss_and_grad(X, y)  # the reference every strategy must match
N = len(X)
print(mlp)
print(f"batch N = {N}, serial loss {serial_loss:.4f}")

# %% [markdown]
# An MLP object holds compiled kernels and does not travel to the engines; its numbers do.
# `install` is sent once with the layer sizes, the flat parameter buffer and the batch as
# its arguments; it rebuilds the same model on every engine and keeps it there
# (`c.run(fn)` runs a plain function on every engine). `on_engines(task, ...)` then runs
# `task(comm, model, X, y, ...)` on every rank through the runner and returns each rank's
# result with the messages it sent (recorded with `trace.recording`, and read *inside* the
# `with` block: when the block closes, a comm that was not tracing forgets them).

# %%
def install(spec, params, X, y):
    """Engine side: build the model from its numbers; keep it and the batch on the engine."""
    from IPython import get_ipython

    from coursekit.nn import MLP

    sizes, activation, loss, dtype = spec
    model = MLP(sizes, activation, loss, dtype=dtype)
    model.params[...] = params
    get_ipython().user_ns["chapter5"] = (model, X.copy(), y.copy())


def with_model(comm, task, *args):
    """Rank side: task(comm, model, X, y, *args) on the installed model, and what it sent."""
    from IPython import get_ipython

    from coursekit.comm.trace import recording

    model, X, y = get_ipython().user_ns["chapter5"]
    with recording(comm) as messages:
        result = task(comm, model, X, y, *args)
        return result, list(messages())  # inside the block: afterwards they are gone


def on_engines(task, *args):
    """[(result, trace) for every rank] of task(comm, model, X, y, *args) on the cluster."""
    return engines.run(with_model, task, *args)


c.run(install, (mlp.sizes, mlp.activation, mlp.loss, mlp.dtype), mlp.params, X, y)


def sent_bytes(traces, checks=False):
    """Bytes each rank sent, from the traces: the payloads, or (checks=True) only the small
    fingerprints the collectives exchange first to check that every rank called them alike."""
    from coursekit.collectives.tags import FINGERPRINT_TAG

    return np.array([sum(m.nbytes for m in t if m.op == "send" and (m.tag == FINGERPRINT_TAG) == checks)
                     for t in traces])


def sent_mb(traces):
    """Megabytes of payload each rank sent, from the traces."""
    return [round(b / 1e6, 2) for b in sent_bytes(traces).tolist()]

# %% [markdown]
# ## 1. Tensor parallelism: split every layer
#
# A layer computes $Z = A W + b$, $A^{out} = \sigma(Z)$, with $W$ of shape
# $(n_{in}, n_{out})$ and one row of $A$ per sample. Split $W$ over $p$ ranks:
#
# * **by columns** (outputs): rank $r$ holds $W_{:, r}$ and $b_r$ and computes its own
#   slice of the outputs $\sigma(A W_{:, r} + b_r)$ from the whole input $A$: no message
#   in the forward pass. In the backward pass each rank only has a partial input gradient
#   $\delta_r W_{:, r}^T$, and $\partial C / \partial A = \sum_r \delta_r W_{:, r}^T$ needs an
#   **allreduce**.
# * **by rows** (inputs): rank $r$ holds $W_{r, :}$ and needs only the slice $A_r$ of the
#   input, exactly what a column-split layer produced. $Z = \sum_r A_r W_{r, :} + b$ needs an
#   **allreduce** in the forward pass; the backward pass needs none
#   ($\partial C/\partial A_r = \delta W_{r,:}^T$, $\partial C/\partial W_{r,:} = A_r^T \delta$).
#
# Alternating column and row layers (as Megatron-LM does) costs one allreduce of an
# $N \times n$ activation per pair of layers forward and one backward; the parameters and
# the matrix products are divided by $p$.

# %%
def tensor_parallel_step(comm, model, X, y):
    from coursekit.parallel.tensor_parallel import TensorParallelMLP

    tp = TensorParallelMLP(comm, model)  # layers 0, 2, 4, 6 split by columns, 1, 3, 5, 7 by rows
    loss, shards = tp.loss_and_grad(X, y)  # one training step: this is the traffic we count
    comm.tracing = False  # only to compare: gather the shards into one whole gradient
    return loss, tp.forward(X)[1], tp.full_grad(shards), [W.shape for _, W, _, _ in tp.shards]


tp = on_engines(tensor_parallel_step)
print("rank 0's weight shards:", tp[0][0][3])
print("loss equal on every rank:  ", all(np.isclose(loss, serial_loss) for (loss, *_), _ in tp))
print("outputs equal to serial:   ", all(np.allclose(out, mlp.forward(X)) for (_, out, *_), _ in tp))
print("gradient equal to serial:  ", all(np.allclose(grad, serial_grad) for (_, _, grad, _), _ in tp))
print("MB sent per rank in a step:", sent_mb([trace for _, trace in tp]))
assert all(np.isclose(loss, serial_loss) for (loss, *_), _ in tp)
assert all(np.allclose(out, mlp.forward(X)) for (_, out, *_), _ in tp)
assert all(np.allclose(grad, serial_grad) for (_, _, grad, _), _ in tp)
tp_sent = sent_bytes([trace for _, trace in tp])
assert tp_sent.tolist() == traffic.tensor_parallel_bytes(mlp.sizes, N, p).tolist()
print("PASS: the bytes sent are those of traffic.tensor_parallel_bytes (next cell)")

# %% [markdown]
# Each rank holds $1/p$ of every weight matrix, and the results are those of the serial
# network. The price is communication: four allreduces forward (after layers 1, 3, 5, 7)
# and three backward (before layers 2, 4, 6 pass their input gradient on), each of an
# $N \times 512$ activation (the last one $N \times 10$). A ring allreduce of $n$ bytes
# sends $2\frac{p-1}{p}n$ bytes per rank (`coursekit.parallel.traffic` has this count for
# every strategy of the chapter):

# %%
allreduced = N * (6 * 512 + 10) * 8  # bytes of activations allreduced per step
print(f"2 (p-1)/p * {allreduced / 1e6:.2f} MB = {2 * (p - 1) / p * allreduced / 1e6:.2f} MB per rank")
assert tp_sent.tolist() == [2 * (p - 1) * allreduced // p] * p
checks_sent = sent_bytes([trace for _, trace in tp], checks=True)
assert checks_sent.tolist() == [traffic.fingerprint_bytes(7, p)] * p
print(f"PASS: measured = formula; plus {checks_sent[0]} B of argument checks per rank")

# %% [markdown]
# Besides these payloads, each of the 7 collectives first exchanges a small fingerprint
# ($(p-1) \times 320$ bytes) to check that every rank called it with the same shapes.
# Note **what** travels: activations, $N \times$ width per layer, and not one weight.
# This traffic sits on the critical path
# of every layer, which is why tensor parallelism is used inside a node, over the fastest
# links (NVLink), and rarely across nodes.
#
# ## 2. The layer split, and why layers limit parallelism
#
# The simplest model split gives each rank a block of whole layers: with our two ranks,
# layers 0-3 on rank 0 and 4-7 on rank 1. The batch goes through rank 0, its output
# activations go to rank 1, and so on; the gradients come back the same way. `layer_split`
# runs it on our ranks:

# %%
from coursekit.parallel.tensor_parallel import layer_split

split = on_engines(layer_split)
step = combine_ranks([result for result, _ in split])
print("gradient equal to serial:  ", np.allclose(step.grad, serial_grad))
print("MB sent per rank in a step:", sent_mb([trace for _, trace in split]))
assert np.allclose(step.grad, serial_grad)
split_sent = sent_bytes([trace for _, trace in split])
assert split_sent.tolist() == traffic.pipeline_bytes(mlp.sizes, N, p).tolist() == [N * 512 * 8] * p
assert split_sent.max() < tp_sent.min() / 5
print(f"PASS: each rank sends N x 512 doubles = {N * 512 * 8 / 1e6:.1f} MB, "
      f"{tp_sent.min() / split_sent.max():.1f}x less than tensor parallelism")

# %% [markdown]
# Only the boundary communicates: rank 0 sends its $N \times 512$ output activations
# (doubles: 2.1 MB) forward and rank 1 sends their gradient, as many bytes, backward; again
# activations, not weights, and far less than tensor parallelism. But the forward pass of layer $l$ needs the
# output of layer $l-1$ and the backward pass goes in the reverse order: there is no
# parallelism between the layers of one batch. With $p$ ranks, $p - 1$ of them wait at any
# moment, and the depth $D$ of the network caps how many workers a layer split can use at
# all (GoogLeNet: $D = 22$). A simulation on $P = 4$ ranks with one time unit per forward
# and two per backward:

# %%
P = 4  # ranks in the simulations
naive = simulate(schedule("gpipe", P, 1), t_f=1.0, t_i=1.0, t_w=1.0)
print(f"idle fraction {naive.bubble_fraction:.2f} = (P-1)/P = {(P - 1) / P:.2f}")
assert np.isclose(naive.bubble_fraction, (P - 1) / P)
plot_schedule(naive.timeline, title="layer split: one batch, one busy rank at a time")
show()

# %% [markdown]
# ## 3. Pipelines: micro-batches keep the stages busy
#
# Cut the mini-batch into $m$ **micro-batches**. As soon as stage 0 has sent micro-batch 0
# on, it starts micro-batch 1, so the stages work on different micro-batches at the same
# time. Gradients of the micro-batches add up to the gradient of the whole batch (each is
# weighted by its share $n_i/N$ of the rows), so the step is still exactly the serial step.
#
# The Greek deck's pipeline slide has a slip. Unit $l$ holds layer $l$; at step $t$ it
# trains on the data subset $S^l$ and hands its results to unit $l + 1$. At step $t + 1$
# unit $l$ moves on to $S^{l+1}$, and unit $l + 1$ processes $S^l$, the subset unit $l$
# finished at step $t$, not $S^{l+1}$ as the slide says (that subset has not left unit $l$
# yet). In the notation below: `F s+1.i` runs after `F s.i`, never with a later micro-batch.
#
# A schedule is data: for every rank an ordered list of actions, each named by what it
# computes (as in `torch.distributed.pipelining`): `F s.i` (forward of stage $s$ on
# micro-batch $i$), `B s.i` (the full backward: input and weight gradient) or, in schedules
# that split the backward, `I s.i` (the input gradient, which the previous stage waits for)
# and later `W s.i` (the weight gradient, which nothing waits for); plus the sends and
# receives between stages. With $p$ stages, $m$ micro-batches and times $T_F$, $T_I$, $T_W$
# per micro-batch and stage, a full backward takes $T_B = T_I + T_W$:
#
# | schedule | order on rank $r$ | idle (bubble) fraction | activations held |
# |---|---|---|---|
# | **GPipe** | all $m$ forwards, then all $m$ backwards | $\frac{p-1}{m+p-1}$ | $m$ micro-batches |
# | **1F1B** (PipeDream-Flush) | $p-1-r$ forwards, then one forward / one backward | $\frac{p-1}{m+p-1}$ | $p - r \le p$ |
# | **interleaved 1F1B** | $v$ model chunks per rank, 1F1B over the chunks | $\frac{p-1}{vm+p-1}$ | more than 1F1B |
# | **ZB-H1** (zero bubble) | 1F1B with each B split into I (input gradient) and W (weight gradient); W fills the gaps | $\frac{p-1}{3m+p-1} \approx \frac{p-1}{3m}$ if $T_F = T_I = T_W$ | up to $p$ on **every** rank (1F1B's peak, but a deferred W keeps its micro-batch's activations) |
#
# The time of a GPipe or 1F1B step is $(m + p - 1)(T_F + T_B)$ instead of
# $m (T_F + T_B)$ without the ramp-up and ramp-down: the bubble shrinks as $m$ grows, and
# 1F1B gets it while holding at most $p$ micro-batches of activations instead of $m$.
#
# The simulator plays a schedule with given action times and checks these formulas
# ($p = P = 4$, $m = 8$, $T_F = T_I = T_W = 1$, so a full backward B lasts 2):

# %%
m = 8
formula = {"gpipe": (P - 1) / (m + P - 1), "1f1b": (P - 1) / (m + P - 1),
           "interleaved_1f1b": (P - 1) / (2 * m + P - 1), "zb_h1": (P - 1) / (3 * m + P - 1)}
sims = {}
print(f"{'schedule':22}{'bubble':>8}{'formula':>9}{'time':>6}   peak activations per rank")
for name in formula:
    v = 2 if name == "interleaved_1f1b" else 1
    sims[name] = simulate(schedule(name, P, m, chunks=v), t_f=1.0, t_i=1.0, t_w=1.0)
    r = sims[name]
    label = name + (f" (v={v})" if v > 1 else "")
    print(f"{label:22}{r.bubble_fraction:8.3f}{formula[name]:9.3f}{r.total_time:6g}   {r.peak_activations.tolist()}")
    assert np.isclose(r.bubble_fraction, formula[name])
assert sims["gpipe"].peak_activations.tolist() == [m] * P
assert sims["1f1b"].peak_activations.tolist() == [P - r for r in range(P)]
assert sims["zb_h1"].peak_activations.tolist() == [P] * P  # 1F1B's peak, on every rank
print("PASS: bubbles = formulas; activations held: GPipe m, 1F1B p - r, ZB-H1 p on every rank")

# %%
fig, axes = plt.subplots(4, 1, figsize=(10, 7.5), sharex=True)
for ax, (name, r) in zip(axes, sims.items()):
    plot_schedule(r.timeline, ax=ax, title=f"{name}: bubble {r.bubble_fraction:.1%}")
axes[0].set_xlim(0, max(r.total_time for r in sims.values()))  # the axes share x: fit the longest
show()

# %% [markdown]
# Read the pictures: in GPipe rank 0 holds all 8 micro-batches' activations before its first
# backward; 1F1B starts backwards as soon as the last stage can, so rank 0 never holds more
# than 4. Interleaving cuts the ramp into $v$ thinner slices (lighter bars: the second
# chunk). ZB-H1 runs each backward as I then W and moves the weight gradients W, which
# nothing waits for, into the holes. The price is memory: a micro-batch's activations stay
# until its W has run, so every rank holds up to $p$ micro-batches (1F1B's rank $r$: $p - r$).
#
# ## 4. Try it: the pipeline panel
#
# Pick a schedule, the number of stages $p$, micro-batches $m$, chunks $v$ (interleaved
# only), the relative times of F, I and W (a full backward B lasts $T_I + T_W$) and a
# point-to-point cost. The panel simulates the schedule and shows the timeline, the bubble
# and the peak activations per rank.
# Things to try: GPipe against 1F1B at $m = 4$ and $m = 32$; ZB-H1 with $T_W = 0$ (it
# becomes 1F1B); a p2p cost of 0.5 (messages now sit on the critical path).

# %%
from coursekit.widgets.pipeline import PipelinePanel

panel = PipelinePanel("1f1b", stages=4, microbatches=8)
panel

# %% [markdown]
# The panel is live: setting its controls from code redraws it (and the picture above).

# %%
print(panel.status.value)
panel.name.value = "zb_h1"
print(panel.status.value)
panel.name.value = "interleaved_1f1b"
panel.chunks.value = 2
print(panel.status.value)
panel.microbatches.value = 6  # interleaving needs m to be a multiple of p: no picture
print(panel.status.value)

# %% [markdown]
# ## 5. The same schedules on the cluster
#
# `execute(comm, schedule, model, X, y)` runs a schedule for real: each of our $p = 2$ ranks
# keeps its 4 layers, performs its list of actions in order, and sends activations and
# gradients to its neighbour over the Comm. It returns this rank's part of the gradient and a measured
# timeline of its compute actions. First: is it the serial step?

# %%
def pipeline_step(comm, model, X, y, sched):
    from coursekit.parallel.pipeline import execute

    return execute(comm, sched, model, X, y)


NAMES = ("gpipe", "1f1b", "zb_h1")
for name in NAMES:
    runs = on_engines(pipeline_step, schedule(name, p, m))
    step = combine_ranks([result for result, _ in runs])
    print(f"{name:6} loss equal: {np.isclose(step.loss, serial_loss)}, gradient equal: "
          f"{np.allclose(step.grad, serial_grad)}, MB sent per rank: {sent_mb([t for _, t in runs])}")
    assert np.isclose(step.loss, serial_loss) and np.allclose(step.grad, serial_grad)
    assert sent_bytes([t for _, t in runs]).tolist() == split_sent.tolist()
print("PASS: every schedule sends the layer split's bytes, traffic.pipeline_bytes")

# %% [markdown]
# Every schedule gives the serial gradient, and every one sends the same bytes: each
# boundary carries each micro-batch once forward and once backward. Only the **order**
# differs. Now we time them (best of three runs each) and draw each measured timeline
# (right) beside the simulated one (left). The simulation uses the measured mean times of
# F, I and W on the slowest rank (of B, timed whole, where the schedule does not split the
# backward), so both are in milliseconds.

# %% tags=["nbval-ignore-output"]
def best_of(sched, runs=3):
    """The fastest of a few runs of sched on the cluster: a PipelineRun in seconds."""
    steps = [combine_ranks([r for r, _ in on_engines(pipeline_step, sched)]) for _ in range(runs)]
    return min(steps, key=lambda s: max(sp.end for spans in s.timeline for sp in spans))


def mean_ms(run, kind):
    """Mean duration of kind's actions on the slowest rank, in ms (0 if there are none)."""
    per_rank = [[sp.end - sp.start for sp in spans if sp.action.kind == kind] for spans in run.timeline]
    return 1e3 * max((np.mean(d) for d in per_rank if d), default=0.0)


import warnings

warnings.filterwarnings("ignore", message="Tight layout not applied")  # legends beside both columns
measured = {}
fig, axes = plt.subplots(len(NAMES), 2, figsize=(10, 7.5), sharex=True)
for row, name in zip(axes, NAMES):
    sched = schedule(name, p, m)
    run = best_of(sched)
    in_ms = [[sp._replace(start=1e3 * sp.start, end=1e3 * sp.end) for sp in spans] for spans in run.timeline]
    total = max(sp.end for spans in in_ms for sp in spans)
    t_i = mean_ms(run, "I") or mean_ms(run, "B")  # a B is timed whole: t_i = its time, t_w = 0
    sim = simulate(sched, t_f=mean_ms(run, "F"), t_i=t_i, t_w=mean_ms(run, "W"))
    busy = sum(sp.end - sp.start for spans in in_ms for sp in spans)
    measured[name] = (total, 1 - busy / (p * total), sim.total_time, sim.bubble_fraction)
    plot_schedule(sim.timeline, ax=row[0], unit="ms", title=f"{name} simulated: {sim.total_time:.0f} ms")
    plot_schedule(in_ms, ax=row[1], unit="ms", title=f"{name} measured: {total:.0f} ms")
for ax in axes.ravel():
    ax.set_xlim(0, max(max(v[0], v[2]) for v in measured.values()))
fig.tight_layout()
show()
for name, (total, bubble, sim_total, sim_bubble) in measured.items():
    print(f"{name:6} measured {total:6.1f} ms, idle {bubble:4.0%}   simulated {sim_total:6.1f} ms, idle {sim_bubble:4.0%}")
    # the simulation of equal F and B times has the table's bubble, (p-1)/(m+p-1) for GPipe
    # and 1F1B; a measured step is never shorter than half the simulated one (the simulation
    # takes the slowest rank's mean action times); its idle share is what noise makes it
    assert name == "zb_h1" or np.isclose(sim_bubble, (p - 1) / (m + p - 1)), (name, sim_bubble)
    assert total >= 0.5 * sim_total and 0 <= bubble < 1, (name, total, sim_total, bubble)

# %% [markdown]
# The measured pictures have the shape the schedule predicts, with two differences worth
# understanding:
#
# * **Communication.** Every hand-over is a Comm message of $N/m \times 512$ doubles (tens
#   to hundreds of microseconds) that the simulation counts as free (the panel's p2p control
#   adds it); a receive that waits for it shows up as a gap.
# * **Unequal and noisy actions.** The simulation gives every action of one letter the same
#   time. Our two stages are nearly equal (rank 0: 64×512 + 3 × 512×512 weights, rank 1:
#   3 × 512×512 + 512×10), but a real machine is noisy: another process that takes the
#   core stretches one bar, and everything that waits for it. In a pipeline the slowest
#   stage sets the pace, which is why a real partitioner (PipeDream's) balances the *time*
#   of the stages, not the number of layers.
#
# ## 6. Data parallelism or model parallelism?
#
# The same step of the same model, four ways on our $p = 2$ engines: serial (one engine
# does everything), data parallel (each rank takes $N/p$ rows and the gradients are
# allreduced, chapter 3), tensor parallel and a 1F1B pipeline with $m = 8$.

# %%
def serial_step(comm, model, X, y):
    if comm.rank == 0:
        model.loss_and_grad(X, y)


def data_parallel_step(comm, model, X, y):
    import numpy as np

    from coursekit.collectives import allreduce
    from coursekit.data import shard

    Xr, yr = shard(X, y, comm.rank, comm.size)
    loss, grad = model.loss_and_grad(Xr, yr)
    w = len(Xr) / len(X)  # the mean over N rows = the sum of the shards' weighted means
    total = allreduce(comm, np.append(grad, loss) * w)
    return total[-1], total[:-1]


def tensor_parallel_only(comm, model, X, y):
    from coursekit.parallel.tensor_parallel import TensorParallelMLP

    return TensorParallelMLP(comm, model).loss_and_grad(X, y)[0]


one_f = schedule("1f1b", p, m)
STRATEGIES = {"serial": (serial_step,), "data parallel": (data_parallel_step,),
              "tensor parallel": (tensor_parallel_only,), "pipeline 1F1B": (pipeline_step, one_f)}
dp = on_engines(data_parallel_step)
print("data parallel gradient equal to serial:", all(np.allclose(g, serial_grad) for (_, g), _ in dp))
assert all(np.allclose(g, serial_grad) for (_, g), _ in dp)
sent = {name: sent_bytes([t for _, t in on_engines(*task)]) for name, task in STRATEGIES.items()}
formula_sent = {"serial": [0] * p,
                "data parallel": traffic.data_parallel_bytes(mlp.params.size + 1, p),  # + the loss
                "tensor parallel": traffic.tensor_parallel_bytes(mlp.sizes, N, p),
                "pipeline 1F1B": traffic.pipeline_bytes(mlp.sizes, N, p)}
for name in STRATEGIES:
    assert sent[name].tolist() == list(formula_sent[name]), name
print("PASS: every strategy sends the bytes of its formula (coursekit.parallel.traffic)")
sent_per_step = {name: round(b.max() / 1e6, 2) for name, b in sent.items()}  # MB, the busiest rank
sent_per_step

# %% [markdown]
# Memory per rank, in MB of float64 (parameters; and the activations kept for the backward
# pass: the input and every layer's output, per row; the largest rank). Data parallelism
# keeps a whole model but only $N/p$ rows; tensor parallelism keeps $1/p$ of the model but
# all $N$ rows (sliced for column-split layers); the pipeline keeps its stage's layers and,
# with 1F1B, at most $p$ micro-batches of $N/m$ rows (on rank 0).

# %%
sizes = mlp.sizes
layer_params = [(a + 1) * b for a, b in zip(sizes[:-1], sizes[1:])]
per_rank = (len(sizes) - 1) // p
stage_of = [range(per_rank * r, per_rank * (r + 1)) for r in range(p)]  # layers of each rank
tp_outputs = sum(n // p if l % 2 == 0 else n for l, n in enumerate(sizes[1:]))  # column outputs are sliced
params_mb = {
    "serial": sum(layer_params),
    "data parallel": sum(layer_params),
    "tensor parallel": sum(a * b // p + (b // p if l % 2 == 0 else b)
                           for l, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))),
    "pipeline 1F1B": max(sum(layer_params[l] for l in s) for s in stage_of),
}
peaks = simulate(one_f).peak_activations  # p - r micro-batches on rank r
acts_mb = {
    "serial": N * sum(sizes),
    "data parallel": N // p * sum(sizes),
    "tensor parallel": N * (sizes[0] + tp_outputs),
    "pipeline 1F1B": max(peaks[r] * N / m * (sizes[s[0]] + sum(sizes[l + 1] for l in s))
                         for r, s in enumerate(stage_of)),
}
from coursekit.parallel.budget import param_bytes

# the parameters agree with section 7's per-rank formula (coursekit.parallel.budget)
for name, strategy in (("data parallel", "data parallel"), ("tensor parallel", "tensor parallel"),
                       ("pipeline 1F1B", "layer split")):
    assert params_mb[name] * 8 == param_bytes(sizes, strategy, p).max(), name
print(f"{'':16}{'params MB':>10}{'activations MB':>16}{'sent MB / step':>16}")
for name in STRATEGIES:
    print(f"{name:16}{params_mb[name] * 8 / 1e6:10.2f}{acts_mb[name] * 8 / 1e6:16.2f}{sent_per_step[name]:16.2f}")

# %% [markdown]
# Data parallelism sends the gradient, the size of the **weights**; the model-parallel
# strategies send **activations**. Here tensor parallelism sends about as much as data
# parallelism only because $N$ = width = 512: per layer it allreduces $N \times$ width
# numbers where data parallelism allreduces width$^2$. Quadruple the batch, or halve the
# width, and the two part ways (the formulas of `coursekit.parallel.traffic`, p = 2):

# %%
print(f"{'MB per rank and step':28}{'data parallel':>14}{'tensor parallel':>16}{'pipeline':>10}")
for n_rows, width in ((N, 512), (4 * N, 512), (N, 256)):
    shape = [64] + [width] * 7 + [10]
    n_params = sum((a + 1) * b for a, b in zip(shape[:-1], shape[1:]))
    row = [traffic.data_parallel_bytes(n_params, p).max(), traffic.tensor_parallel_bytes(shape, n_rows, p).max(),
           traffic.pipeline_bytes(shape, n_rows, p).max()]
    print(f"N = {n_rows:4}, width = {width:3}        " + "".join(f"{b / 1e6:{w}.2f}" for b, w in zip(row, (14, 16, 10))))
    if n_rows == 4 * N:
        assert row[1] > 3 * row[0]  # activations grow with the batch, the gradient does not
    if width == 256:
        assert row[0] < row[1] / 1.5  # the gradient shrinks with width^2, activations with width
print("PASS: tensor-parallel traffic grows with N x width, data-parallel with width^2")

# %% [markdown]
# And the throughput: images per second for one training step (best of five, each rank
# timing between two barriers).

# %% tags=["nbval-ignore-output"]
def timed(comm, model, X, y, task, *args, repeats=5):
    from coursekit.comm.trace import now

    best = float("inf")
    for _ in range(repeats):
        comm.barrier()
        start = now()
        task(comm, model, X, y, *args)
        comm.barrier()
        best = min(best, now() - start)
    return best


seconds = {name: max(t for t, _ in on_engines(timed, *task)) for name, task in STRATEGIES.items()}
for name, s in seconds.items():
    print(f"{name:16}{s * 1e3:8.1f} ms per step {N / s:8.0f} images/s  x{seconds['serial'] / s:.2f}")
fastest = min(seconds, key=seconds.get)
print(f"fastest here: {fastest}")
# p engines on p cores cannot do better than p times one engine; 1.5 p leaves room for a
# serial run slowed by another process on a loaded machine
assert all(seconds["serial"] / s < 1.5 * p for s in seconds.values())
print(f"PASS: no strategy is more than {1.5 * p:g}x faster than one engine")
fig, ax = plt.subplots(figsize=(6, 2.8))
ax.barh(list(seconds), [N / s for s in seconds.values()], color="C0")
ax.invert_yaxis()
ax.set(xlabel="images per second", title=f"one training step on {p} engines (2 CPU cores)")
fig.tight_layout()
show()

# %% [markdown]
# The lecture's summary. Our numbers show its communication and memory rows (the bytes
# sent and the megabytes held above are exact, asserted against their formulas). The
# throughput factors are measured, and on two shared CPU cores noise can reorder them. On the
# course's reference machine data parallelism usually comes out fastest, ahead of tensor
# parallelism and the 1F1B pipeline, none near x2: each of its ranks computes half the rows
# with no message until the one 13 MB allreduce at the end, while tensor parallelism waits
# at seven allreduces and the pipeline at its ramp-up and ramp-down. The cell prints which
# was fastest on your machine; what it asserts is only the bound no noise should break (two
# engines on two cores cannot be much more than twice as fast as one). See chapter 3 for when
# the gradient exchange pays.
#
# | | data parallel | model parallel (tensor, layer split, pipeline) |
# |---|---|---|
# | throughput | grows with the workers | drops (layer split), or grows only as far as the stages stay busy (pipeline) |
# | communication | one gradient allreduce per step, can overlap the backward pass | activations in **every** forward and backward pass, on the critical path (tensor parallel: after every pair of layers; pipeline: only at stage boundaries) |
# | memory per worker | a whole model (parameters, gradients, optimizer state) | $1/p$ of the model; activations of the whole batch (tensor) or of the micro-batches in flight (pipeline) |
# | implementation | simple | harder: split the layers, schedule the micro-batches |
# | typical use | speed up training | a model that does not fit one device |
#
# Use data parallelism whenever the model fits. When it does not, large systems combine all
# three: tensor parallelism inside a node, pipeline stages across nodes, data parallelism
# over copies of the whole pipeline ("3-D parallelism").
#
# Two CPU cores can give at most a factor of two, and that only to the strategy that keeps
# both busy with little waiting; the point of the measurement is *where the time goes*.
# Chapter 7 simulates the same trade-offs at a thousand GPUs.

# %% [markdown]
# ## 7. When is model parallelism worth it? A model that does not fit
#
# The table's last row is the reason model parallelism exists: a model too big for one
# device. Give every engine a **memory budget** for parameters, here 8 MB (a GPU has
# gigabytes; the arithmetic is the same). Our model's parameters take 12.9 MB in float64,
# so data parallelism, which keeps a whole copy on every engine, is refused before any
# engine starts. The layer split and the tensor split keep about half on each engine
# (`coursekit.parallel.budget.param_bytes`: a layer split holds its block of layers; a
# tensor split holds half of every matrix, plus a row layer's whole bias) and run the
# same step:

# %%
from coursekit.parallel.budget import BudgetConfig, MemoryBudgetError, param_bytes, step_within_budget

BUDGET = 8_000_000  # parameter bytes one engine may hold
refused = None
try:
    step_within_budget(engines, BudgetConfig(mlp.sizes, "data parallel", BUDGET), X, y)
except MemoryBudgetError as err:
    refused = err
assert refused is not None and (refused.needed, refused.budget) == (mlp.params.nbytes, BUDGET)
print(refused)
for strategy in ("layer split", "tensor parallel"):
    fit = step_within_budget(engines, BudgetConfig(mlp.sizes, strategy, BUDGET), X, y)
    assert np.isclose(fit.loss, serial_loss) and np.allclose(fit.grad, serial_grad)
    assert fit.held_bytes.tolist() == param_bytes(mlp.sizes, strategy, p).tolist()
    assert fit.held_bytes.max() <= BUDGET
    print(f"{strategy}: MB of parameters per engine {[round(b / 1e6, 2) for b in fit.held_bytes.tolist()]}"
          f" <= {BUDGET / 1e6:g} MB; step equal to serial")

# %% [markdown]
# Each engine here builds the whole MLP and computes with views of its part; `held_bytes`
# counts the arrays of that part, what an engine that allocated only its part would hold.
#
# The English deck names two alternatives before splitting the model. **Pruning** removes
# the weights of smallest magnitude. It saves memory only when the survivors are stored
# sparse: in CSR each kept weight costs its value (8 bytes) and a column index (4 bytes),
# so a pruned layer is smaller than the dense one only below two thirds of its weights.
# `coursekit.memory.pruning.keep_to_fit` gives how many weights fit the budget.

# %%
from coursekit.memory.pruning import keep_to_fit, magnitude_prune, sparse_bytes
from coursekit.nn.train import train as train_serial

n_weights = sum(a * b for a, b in zip(mlp.sizes[:-1], mlp.sizes[1:]))
kept = keep_to_fit(mlp.sizes, BUDGET)
assert sparse_bytes(mlp.sizes, kept) <= BUDGET < sparse_bytes(mlp.sizes, kept + 1)
assert kept == (BUDGET - 8 * sum(mlp.sizes[1:]) - 4 * sum(n + 1 for n in mlp.sizes[:-1])) // 12
keep_fraction = kept / n_weights
print(f"to fit {BUDGET / 1e6:g} MB, pruning keeps {kept:,} of {n_weights:,} weights "
      f"({keep_fraction:.0%}): {sparse_bytes(mlp.sizes, kept) / 1e6:.2f} MB in CSR, "
      f"from {mlp.params.nbytes / 1e6:.2f} MB dense")

# %% [markdown]
# What does it cost in accuracy? Training our 1.6-million-parameter model takes minutes on
# two shared cores, too long for this notebook, so we measure the cost on chapter 1's
# MLP 64-64-10, trained, then pruned to the same fraction (no retraining after pruning):

# %%
small = MLP([64, 64, 10], activation="relu", dtype=np.float64, seed=0)
train_serial(small, digits.X_train, digits.y_train, epochs=10, batch_size=32, lr=0.1)
small_weights = sum(layer.W.size for layer in small.layers)
pruned = magnitude_prune(small, round(keep_fraction * small_weights))
before = small.accuracy(digits.X_test, digits.y_test)
after = pruned.accuracy(digits.X_test, digits.y_test)
assert before > 0.9 and 0 <= before - after < 0.05, (before, after)
print(f"test accuracy {before:.2f} dense, {after:.2f} with {keep_fraction:.0%} of the weights: "
      "a cost under 5 points")

# %% [markdown]
# The other alternative is to **train on the CPU**, whose host memory is far larger than a
# GPU's (chapter 1 trained this way): slower per step, but nothing needs splitting.

# %% tags=["nbval-ignore-output"]
from coursekit.checks import memory_limit

host = memory_limit()
# weights, gradient and momentum, and the activations of one step on N rows (section 6)
training_bytes = 3 * mlp.params.nbytes + acts_mb["serial"] * 8
assert training_bytes < host / 100
print(f"this machine's host memory: {host / 1e9:.1f} GB, {host / training_bytes:,.0f} times what one "
      f"serial training step of our model needs ({training_bytes / 1e6:.0f} MB)")

# %% [markdown]
# **Try it.** Move the budget and pick a strategy: Run runs one step of the same model on
# the engines, or refuses before any engine starts and says what each strategy would need.
# Where does the layer split stop fitting? (Its ranks hold unequal halves: the first
# layer, 64 × 512, is smaller than the others.)

# %%
from coursekit.widgets.budget import BudgetPanel

budget_panel = BudgetPanel(mlp.sizes, (X, y), budget_mb=BUDGET / 1e6, cluster=c,
                           restart=lambda: cluster.start(n=2), prepare=setup_comm)
budget_panel

# %% [markdown]
# **AlexNet's two-GPU split** (Krizhevsky et al. 2012, the Spanish deck's example) is a
# tensor split of every layer: each GTX 580 (3 GB) held half of every layer's kernels.
# The GPUs exchanged data only at the layers whose kernels read **both** halves of the
# layer below: conv3, fc6, fc7, fc8 (and the softmax's 1000 outputs). conv2, conv4 and
# conv5 read only their own GPU's maps. `coursekit.parallel.alexnet_split` counts, from the
# paper's layer shapes, the parameters each GPU holds and the bytes it sends in a step
# (batch 128, float32, forward activations and backward gradients):

# %%
from coursekit.parallel.alexnet_split import alexnet_split

alex = alexnet_split()
print(f"{'layer':8}{'params per GPU':>16}{'values sent per GPU and image':>31}")
for name, (n_params, n_sent) in alex.per_layer.items():
    print(f"{name:8}{n_params:16,}{n_sent:31,}")
assert alex.params_per_gpu == 30_482_612  # 2 x 30.5 M: the paper's "60 million parameters"
assert alex.sent_bytes_per_gpu == 2 * 128 * 4 * (13 * 13 * 128 + 6 * 6 * 128 + 2048 + 2048 + 500)
assert alex.data_parallel_bytes_per_gpu == 2 * (2 - 1) / 2 * (2 * alex.params_per_gpu) * 4
print(f"per GPU: {alex.param_bytes_per_gpu / 1e6:.1f} MB of parameters; sends "
      f"{alex.sent_bytes_per_gpu / 1e6:.1f} MB per step, where data parallelism would allreduce "
      f"{alex.data_parallel_bytes_per_gpu / 1e6:.1f} MB of gradient")

# %% [markdown]
# 122 MB of parameters per GPU fits 3 GB easily: what filled the GPUs was the activations
# of a batch of 128 large images and the working memory of the convolutions. The split
# sends 31.6 MB per GPU and step, almost 8 times less than data parallelism's 243.9 MB:
# AlexNet's fully connected layers hold 96% of its weights and few activations, exactly
# where model parallelism communicates little. (Krizhevsky's later "one weird trick",
# 2014, drew the conclusion: data parallelism for the convolutions, model parallelism for
# the fully connected layers.)

# %% [markdown]
# ## When you are done
#
# The cluster keeps running until you shut down the kernel (Kernel > Shut Down Kernel):
# its cluster stops with it, even if the kernel is killed (a watchdog, `coursekit.cluster.reaper`,
# then ends the engines). To stop it now: `c.stop()`.
