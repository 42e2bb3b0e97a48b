# %% [markdown]
# # 08 · Memory: where the bytes go, ZeRO, mixed precision, recomputation
#
# Chapters 3 and 5 split the *work*; this chapter follows the *bytes*. Training a model of
# Ψ parameters keeps, on every data-parallel GPU:
#
# * the **parameters** (P bytes each), the **gradients** (G bytes each),
# * the **optimizer states** (K bytes per parameter: momentum's velocity; Adam's two
#   moments; in mixed precision also the fp32 master copy of the weights),
# * the **activations** each layer keeps for the backward pass, per sample in the batch.
#
# With mixed-precision Adam, P = G = 2 and K = 4 + 4 + 4 = 12: 16 bytes per parameter
# before a single activation. The "7B" model of section 1 (LLaMA-7B's dimensions in GPT's
# layout: Ψ = 6.58 billion) needs 16Ψ = 105 GB, more than an 80 GB GPU holds (section 1
# computes it from the model's shape). This chapter measures these bytes on real buffers
# and checks them against the formulas, then removes them the way production systems do:
#
# 1. **ZeRO** (DeepSpeed; FSDP is its stage 3) shards optimizer states, gradients and
#    parameters over the N data-parallel ranks, run here on the engines;
# 2. **mixed precision** halves weights, gradients and activations, with **loss scaling**
#    so that small gradients survive 16 bits;
# 3. **activation recomputation** keeps a stage's input instead of every layer's output
#    and runs the forward again during the backward.

# %%
import matplotlib.pyplot as plt
import numpy as np

from coursekit import cluster
from coursekit.comm import setup_comm
from coursekit.data import load_digits
from coursekit.memory import PRESETS, TrainingSetup, measure_mlp, memory_per_gpu, mlp_shape
from coursekit.nn import MLP
from coursekit.parallel.zero import ShardLayout, sent_bytes, state_bytes, train_zero
from coursekit.cluster.runner import ClusterRunner, LocalRunner
from coursekit.viz import integer_ticks, legend_outside, series_color, show

c = cluster.start(n=4)
setup_comm(c)
engines = ClusterRunner(c)  # the runs below use these engines (c.run: every engine, no comm)
engines

# %% [markdown]
# ## 1. Where the bytes go
#
# Chapter 1's MLP keeps its parameters in one flat buffer; the gradient is a second one;
# momentum adds a velocity buffer; the forward keeps $A^0 = X, A^1, \dots, A^L$ for the
# backward: $b \sum_l n_l$ values for a micro-batch of $b$ rows and layer widths $n_l$.
# `measure_mlp` builds the net on each engine, runs a forward and backward and sums the
# `nbytes` of what it really holds; `memory_per_gpu` computes the same four numbers from
# the formulas.

# %%
sizes, batch = [64, 128, 64, 10], 32
on_engines = [m.memory for m in c.run(measure_mlp, sizes, micro_batch=batch, optimizer="momentum")]
formula = memory_per_gpu(mlp_shape(sizes), TrainingSetup(precision="fp32", optimizer="momentum",
                                                         micro_batch=batch))
for name in ("parameters", "gradients", "optimizer_states", "activations"):
    print(f"{name:17s} measured {getattr(on_engines[0], name):8.0f} B   formula "
          f"{getattr(formula, name):8.0f} B")
assert all(measured == formula for measured in on_engines)
print(f"PASS: on all {c.size} engines every category measured on the real buffers equals the "
      "formula, byte for byte")

# %% [markdown]
# The same formulas for models that matter (one GPU, no sharding, mixed-precision Adam,
# micro-batch 1: a sequence of 2048 tokens for the 7B model, one 224 x 224 image for
# ResNet-50). Activations follow Korthikanti et al. (2022): $s b h (34 + 5 a s / h)$ bytes
# per transformer layer in 16 bits.

# %%
mem = {key: memory_per_gpu(PRESETS[key], TrainingSetup(precision="bf16", optimizer="adam"))
       for key in ("gpt2-small", "gpt-7b-2k", "resnet50")}
for key, m in mem.items():
    print(f"{PRESETS[key].name:20s} Ψ = {PRESETS[key].n_params / 1e6:7.0f} M: parameters "
          f"{m.parameters / 1e9:6.2f} GB, gradients {m.gradients / 1e9:6.2f}, optimizer "
          f"{m.optimizer_states / 1e9:6.2f}, activations {m.activations / 1e9:6.2f}")
    n_params = PRESETS[key].n_params
    assert m.optimizer_states == 12 * n_params and m.parameters + m.gradients == 4 * n_params
# Korthikanti et al.'s s h (34 + 5 a s / h) bytes per layer, L layers, one sequence (b = 1)
dims = {"gpt2-small": (12, 768, 12, 1024), "gpt-7b-2k": (32, 4096, 32, 2048)}  # L, h, a, s
for key, (L, h, a, s) in dims.items():
    assert mem[key].activations == L * s * (34 * h + 5 * a * s)
assert mem["resnet50"].activations == 2 * 37_710_312  # the image + every layer's output, 16 bits
psi_7b, seven_b = PRESETS["gpt-7b-2k"].n_params, mem["gpt-7b-2k"]
states_7b = seven_b.parameters + seven_b.gradients + seven_b.optimizer_states
print(f"7B: Ψ = {psi_7b:,}, model states 16Ψ = {states_7b / 1e9:.0f} GB; with the activations "
      f"{seven_b.total / 1e9:.0f} GB")
assert states_7b == 16 * psi_7b and round(16 * psi_7b / 1e9) == 105  # the introduction's 105 GB
assert states_7b > 80e9 and seven_b.total > 80e9
print("PASS: the optimizer states are 12 of the 16 bytes per parameter; the activations are "
      "Korthikanti's formula; the 7B model's states alone, 16Ψ = 105 GB, exceed 80 GB")

# %% [markdown]
# Everything above is bytes per parameter times Ψ, plus the activations. `bytes_per_param`
# gives P, G and K for each precision and optimizer. The weights alone take P bytes a
# parameter: 4 in fp32, 2 in 16 bits.
#
# A deck slip to avoid: the Greek lecture sizes modern networks at "100M-2B parameters,
# 0.1-8 GB". Its two ends use different bytes per parameter. 2B parameters in 8 GB fixes
# 4 bytes a parameter (fp32 weights); then 100M parameters are 0.4 GB, not 0.1 GB. 0.1 GB
# would need 1 byte a parameter (int8), and then 2B parameters would be 2 GB. Training
# needs far more than the weights: 16 bytes a parameter with Adam, 32 GB for 2B parameters.

# %%
from coursekit.memory import bytes_per_param

for precision in ("fp32", "bf16"):
    for optimizer in ("sgd", "momentum", "adam"):
        P, G, K = bytes_per_param(precision, optimizer)
        print(f"{precision} {optimizer:8s}: P {P} + G {G} + K {K:2d} = {P + G + K:2d} bytes "
              "per parameter")
assert sum(bytes_per_param("fp32", "adam")) == sum(bytes_per_param("bf16", "adam")) == 16

weight_bytes = bytes_per_param("fp32", "sgd")[0]
deck = {100_000_000: 100_000_000, 2_000_000_000: 8_000_000_000}  # parameters: the deck's bytes
for n, said in deck.items():
    print(f"{n:>13,} parameters: fp32 weights {n * weight_bytes / 1e9:g} GB, the deck says "
          f"{said / 1e9:g} GB ({said / n:g} B per parameter); Adam training "
          f"{n * sum(bytes_per_param('bf16', 'adam')) / 1e9:g} GB")
assert weight_bytes == 4 and 2_000_000_000 * weight_bytes == deck[2_000_000_000]
assert 100_000_000 * weight_bytes == 400_000_000 != deck[100_000_000]
one_byte = deck[100_000_000] // 100_000_000  # what the deck's 0.1 GB assumes
assert one_byte == 1 and 2_000_000_000 * one_byte == 2_000_000_000 != deck[2_000_000_000]
print("PASS: the deck's 8 GB for 2B parameters is 4 bytes per parameter, so 100M parameters "
      "are 0.4 GB; its 0.1 GB is 1 byte per parameter, which would make 2B parameters 2 GB")

# %% [markdown]
# ZeRO's own example (Rajbhandari et al. 2020, Figure 1): Ψ = 7.5 B parameters, N = 64 GPUs,
# K = 12. Sharding the optimizer states (stage 1), then the gradients (stage 2), then the
# parameters (stage 3) over the 64 GPUs:

# %%
from coursekit.memory import Kept, ModelShape

paper = ModelShape("ZeRO Figure 1", 7_500_000_000, 6 * 7.5e9, Kept())  # no activations counted
per_stage = [memory_per_gpu(paper, TrainingSetup(precision="fp16", optimizer="adam", dp=64,
                                                 stage=s)).total / 1e9 for s in range(4)]
print("GB per GPU, stages 0-3:", [round(x, 1) for x in per_stage])
assert [round(x, 1) for x in per_stage] == [120.0, 31.4, 16.6, 1.9]
print("PASS: 120, 31.4, 16.6 and 1.9 GB per GPU, the paper's numbers")

# %% [markdown]
# ## 2. ZeRO on the engines
#
# `coursekit.parallel.zero` runs the stages on the flat buffer over the engines' Comm.
# Each layer's block is padded with zeros to N equal chunks and rank r owns chunk r of
# every layer (FSDP's view): C values, 1/N of the buffer.
#
# | stage | a rank keeps | a step sends (all ranks) |
# |---|---|---|
# | 0 | params Ψ, grads Ψ, optimizer kΨ | ring allreduce: 2(N-1)Ψ |
# | 1 | params Ψ, grads Ψ, optimizer (1+k)C (a master copy of its shard + state) | reduce-scatter + all-gather: 2(N-1)NC |
# | 2 | params Ψ, grads C, optimizer (1+k)C | the same, each layer's gradient scattered as soon as it is computed |
# | 3 | params C, grads C, optimizer kC | all-gather each layer before its forward and again before its backward + reduce-scatter: 3(N-1)NC |
#
# (k = 1 buffer for momentum, values of 8 bytes in float64.) Every stage must take exactly
# the step of serial training on the same global batches.

# %%
digits = load_digits(dtype=np.float64)
zero_sizes = (64, 96, 64, 10)
X, y = digits.X_train[:768], digits.y_train[:768]


settings = dict(steps=12, batch_size=64, lr=0.1, momentum=0.9)
serial = MLP(zero_sizes, dtype=np.float64, seed=1)
runs = {stage: engines.run(train_zero, serial, X, y, stage=stage, **settings)
        for stage in range(4)}
serial_run = LocalRunner(1).run(train_zero, serial, X, y, stage=0, **settings)[0]  # serial
for stage, results in runs.items():
    for r in results:
        np.testing.assert_allclose(r.params, serial_run.params, rtol=1e-12, atol=1e-14)
print("PASS: on 4 engines every stage's weights equal serial training's after 12 steps (float64)")

# %%
layout = ShardLayout.of(serial, c.size)
fig, (ax_mem, ax_sent) = plt.subplots(1, 2, figsize=(10, 3.2), layout="constrained")
categories = ("params", "grads", "optimizer")
bottom = np.zeros(4)
for i, category in enumerate(categories):
    values = np.array([runs[s][0].memory[category] for s in range(4)]) / 1e3
    ax_mem.bar(range(4), values, bottom=bottom, color=series_color(i), label=category)
    bottom += values
ax_mem.set(xticks=range(4), xticklabels=[f"stage {s}" for s in range(4)],
           ylabel="kB per rank", title="model states a rank holds (measured)")
legend_outside(ax_mem)
sent = [sum(r.sent for r in runs[s]) for s in range(4)]  # bytes, all ranks, 12 steps
ax_sent.bar(range(4), np.array(sent) / 12 / 1e3, color=series_color(4))
ax_sent.set(xticks=range(4), xticklabels=[f"stage {s}" for s in range(4)],
            ylabel="kB per step, all ranks", title="bytes sent (from the trace)")
show()

for stage, results in runs.items():
    assert all(r.memory == state_bytes(stage, serial.n_params, layout, 8, 1) for r in results)
    assert sum(r.sent for r in results) == 12 * sent_bytes(stage, serial.n_params, layout, 8)
assert 2 * sent[3] == 3 * sent[1] and sent[1] == sent[2]
padding = c.size * layout.width - serial.n_params  # zeros that make the chunks equal
assert sent[1] - sent[0] == 12 * 2 * (c.size - 1) * padding * 8
print("PASS: every rank holds exactly the table's bytes at every stage; the bytes sent equal "
      f"the formulas; stages 1 and 2 send stage 0's bytes plus {padding} padding values per "
      "pass; stage 3 sends 1.5 x stage 1 and 2")

# %% [markdown]
# Stages 1 and 2 send what stage 0 sends, apart from the padding zeros: a ring allreduce
# *is* a reduce-scatter followed by an all-gather, and ZeRO only moves the update in between. Stage 3 pays one
# more all-gather of the weights per step (the backward needs them again) for holding
# only 1/N of them. The bars also show what sharding costs on a small net: the padding (at
# most N-1 zeros per layer) and, at stages 1 and 2, the master copy of the shard (with
# mixed precision, next section, that copy is kept anyway).
#
# ## 3. Mixed precision and loss scaling
#
# fp16 has 5 exponent bits: the smallest positive value is $2^{-24} \approx 6 \cdot 10^{-8}$
# and the largest 65504. bfloat16 keeps fp32's 8 exponent bits and only 7 mantissa bits.
# Late in training many activation gradients are tiny, and fp16 rounds them to zero.
# Multiplying the loss by $S = 2^k$ moves every gradient $k$ binades up (exactly: only
# the exponent changes); the fp32 master gradient is divided by $S$ again.
#
# The experiments below emulate the 16-bit formats on the CPU (every value rounded as the
# format stores it). On a GPU, `MixedPrecision(..., device="cuda")` runs the same step with
# float16 storage and float32 accumulation in the CUDA kernels, with the same loss scaling
# (bfloat16 stays on the CPU: numba has no bfloat16 type).

# %%
from coursekit.nn.mixed_precision_demos import compare_formats, overflow, underflow

u = underflow(epochs=20)
for label, lost, err in zip(u.labels, u.lost_activation_grads, u.grad_error):
    print(f"{label:18s} activation gradients lost ≈{lost:.2%}, weight-gradient error ≈{err:.2%}")
print(f"predicted for fp16 without scaling (fp32 values <= 2^-25): ≈{u.below_fp16:.2%}")

fig, ax = plt.subplots(figsize=(7, 3), layout="constrained")
nonzero = u.fp32_activation_grads[u.fp32_activation_grads > 0]
ax.hist(np.log2(nonzero), bins=80, color=series_color(0))
ax.axvline(-24, color="black", linestyle="--", label="fp16's smallest value 2^-24")
ax.set(xlabel="log2 |activation gradient| (fp32)", ylabel="values",
       title="activation gradients after 20 epochs")
legend_outside(ax)
show()
assert u.lost_activation_grads[0] > 0.1 and abs(u.lost_activation_grads[0] - u.below_fp16) < 0.01
assert u.lost_activation_grads[1] < 0.01 and u.lost_activation_grads[2] == 0
assert np.all((0 < u.grad_error) & (u.grad_error < 0.1))
print("PASS: fp16 without scaling loses over 10% of the activation gradients (as predicted to "
      "within a point), loss scaling keeps all but under 1%, bf16 loses none; every 16-bit "
      "weight gradient is off by less than 10%")

# %% [markdown]
# bf16 loses nothing to underflow, yet its weight-gradient error is about **3 times**
# fp16's: bf16 keeps 7 mantissa bits against fp16's 10, so every value it stores is
# rounded 8 times more coarsely (a relative error of up to $2^{-8}$ against $2^{-11}$).
# Scaling does not change fp16's error much: it saves the tiny values from underflow, and
# they hardly weigh in the gradient, but it adds no mantissa bit. Why 3× and not 8×? With
# ReLU, rounding a pre-activation near 0 can switch a unit on or off: an all-or-nothing
# change, with a chance proportional to the rounding, so that part of the error grows only
# like the square root of the rounding ($\sqrt{8} \approx 2.8$). With tanh, which has no
# such switch, the ratio comes close to 8 (the same measurement on a tanh network):

# %%
ratios = u.grad_error[2] / u.grad_error[:2]  # bf16 over fp16 without and with scaling
smooth = underflow(epochs=20, activation="tanh")
smooth_ratio = smooth.grad_error[2] / smooth.grad_error[1]
print(f"bf16's weight-gradient error / fp16's: ≈{ratios[0]:.1f}x (no scaling), "
      f"≈{ratios[1]:.1f}x ({u.labels[1]}); tanh network: ≈{smooth_ratio:.1f}x; "
      f"rounding: 2^-8 / 2^-11 = {2.0**-8 / 2.0**-11:g}x")
assert np.all((1.5 < ratios) & (ratios < 8))
assert abs(u.grad_error[0] - u.grad_error[1]) < 0.25 * u.grad_error[1]
assert ratios.max() < smooth_ratio < 10 and smooth_ratio > 5
print("PASS: bf16's error is 1.5x to 8x fp16's, with or without scaling (fp16's two errors "
      "within 25% of each other); with tanh the ratio is above 5x, nearer the rounding's 8x, "
      "and above ReLU's")

# %% [markdown]
# Does it matter for training? Four runs from the same weights and batches: fp32, fp16
# with dynamic loss scaling (start at $2^{16}$, double after 100 good steps, halve and skip
# the step on an overflow), bf16, and fp16 without scaling. PyTorch's `GradScaler` also
# starts at $2^{16}$ but by default doubles only after 2000 good steps
# (`growth_interval=2000`); these runs are 10 epochs of 43 steps (430), far fewer than 2000,
# so we grow S after 100 to see it grow at all. Then the same with every
# gradient made $2^{22}$ times smaller (the loss multiplied by $\lambda = 2^{-22}$ and the
# learning rate divided by it: in fp32 exactly the same training), as for a loss term with
# a small weight.

# %%
plain = compare_formats(seed=0)
tiny = compare_formats(seed=0, loss_weight=2.0**-22)
for name, result in (("loss as is", plain), ("loss x 2^-22", tiny)):
    print(name + ": " + ", ".join(f"{label} ≈{acc:.1%}" for label, acc in
                                  zip(result.labels, result.test_accuracy)))
scales = tiny.histories[1].scales  # fp16 + loss scaling, every step
print(f"fp16 + loss scaling: {scales.size} steps; S grew from 2^{np.log2(scales[0]):g} to "
      f"2^{np.log2(scales.max()):g} (PyTorch's default of 2000 good steps would keep 2^16)")
# no step overflowed, so S doubled after every 100 steps: 2^16 x 2^(430 // 100) = 2^20
assert not tiny.histories[1].skipped.any() and scales[0] == 2.0**16
assert scales.size == 10 * 43 < 2000 and scales.max() == 2.0**16 * 2 ** (scales.size // 100)
fp32 = plain.test_accuracy[0]
assert fp32 > 0.9  # the MLP learns digits
assert np.all(np.abs(plain.test_accuracy - fp32) <= 0.015)
assert np.all(np.abs(tiny.test_accuracy[:3] - tiny.test_accuracy[0]) <= 0.015)
assert tiny.test_accuracy[3] < tiny.test_accuracy[0] - 0.2
print("PASS: fp32 tests above 90%; on digits every format reaches fp32's accuracy within 1.5 "
      "points; with tiny gradients fp16 without loss scaling falls more than 20 points behind, "
      "the others do not; S doubled every 100 steps, never halved")

# %% [markdown]
# A scale that is too large overflows (values from 65520 become inf). The dynamic scaler
# halves S and skips the step until the backward is finite again: started at $S_0$, it
# skips $\lfloor \log_2(S_0 / S_{limit}) \rfloor + 1$ steps, where $S_{limit}$ = 65520 /
# (the largest scaled value of the backward at S = 1).

# %%
o = overflow(initial_scale=2.0**24)
print(f"S_limit = {o.limit_scale:.3g} (2^{np.log2(o.limit_scale):.2f}); skipped {o.skips} steps, "
      f"predicted {o.predicted_skips}; scales tried: {[f'2^{np.log2(s):g}' for s in o.scales]}")
assert o.skips == o.predicted_skips
assert list(o.scales) == [o.initial_scale / 2**k for k in range(o.skips + 1)]  # halved each skip
assert o.scales[-1] < o.limit_scale <= o.scales[-2]  # the first S below the limit is taken
print("PASS: the scaler skipped exactly the predicted number of steps, halving S each time, "
      "and took the first S below S_limit")

# %% [markdown]
# Memory: with Adam, fp32 training keeps 4 + 4 + 8 = 16 bytes per parameter; mixed
# precision keeps 2 + 2 + 12 = 16 as well, because the optimizer needs an fp32 master copy
# of the weights. So the model states do not shrink; the activations almost halve (the
# dropout masks stay one byte a value), and they dominate for long sequences. (The other reason for 16 bits is speed: tensor cores run
# them many times faster than fp32.)

# %%
for precision in ("fp32", "bf16"):
    m = memory_per_gpu(PRESETS["gpt-7b-2k"], TrainingSetup(precision=precision, optimizer="adam"))
    print(f"7B, {precision}: model states {(m.parameters + m.gradients + m.optimizer_states) / 1e9:.0f} GB, "
          f"activations {m.activations / 1e9:.1f} GB")
fp32_m, bf16_m = (memory_per_gpu(PRESETS["gpt-7b-2k"], TrainingSetup(precision=p, optimizer="adam"))
                  for p in ("fp32", "bf16"))
ratio = bf16_m.activations / fp32_m.activations
# per sequence: `values` at 4 or 2 bytes, one-byte dropout masks (coursekit.memory.shapes)
stored = PRESETS["gpt-7b-2k"].kept, PRESETS["gpt-7b-2k"].kept_split
values, masks = sum(k.values for k in stored), sum(k.mask_bytes for k in stored)
assert fp32_m.activations == 4 * values + masks and bf16_m.activations == 2 * values + masks
assert 0.5 < ratio < 0.6
assert bf16_m.parameters + bf16_m.gradients + bf16_m.optimizer_states == \
    fp32_m.parameters + fp32_m.gradients + fp32_m.optimizer_states == 16 * psi_7b
print(f"PASS: 16-bit training keeps {ratio:.0%} of fp32's activation bytes; with Adam's fp32 "
      "master copy the model states stay at 16 bytes per parameter")

# %% [markdown]
# ## 4. Activation recomputation
#
# In a pipeline (chapter 5) a stage keeps the activations of every micro-batch in flight.
# With recomputation it keeps only the stage's *input* and runs the stage's forward again
# just before its backward: memory down, one more forward per micro-batch, the same
# gradient. Here on the 4 engines, 1F1B with 8 micro-batches, 2 layers per stage:

# %%
from coursekit.parallel.pipeline import peak_activations, run_pipeline, schedule, stage_layers

pipe_mlp = MLP([64, 256, 256, 256, 256, 256, 256, 256, 10], dtype=np.float64, seed=0)
Xp, yp = digits.X_train[:256], digits.y_train[:256]
sched = schedule("1f1b", c.size, 8)


kept, again = (run_pipeline(engines, sched, (Xp, yp), mlp=pipe_mlp, recompute=flag)
               for flag in (False, True))
for rank in range(c.size):
    print(f"rank {rank}: peak activations {kept.peak_activation_bytes[rank] / 1e3:6.0f} kB -> "
          f"{again.peak_activation_bytes[rank] / 1e3:6.0f} kB; layer forwards "
          f"{kept.layer_forwards[rank]} -> {again.layer_forwards[rank]}")
np.testing.assert_array_equal(again.grad, kept.grad)
assert again.layer_forwards == [2 * f for f in kept.layer_forwards]
# the formula: rank r holds f_r micro-batches of b rows at its peak (1F1B: min(p - r, m));
# each keeps the stage's input n_in and its layers' outputs, or only the input with
# recomputation, plus the outputs of the one micro-batch whose backward runs
in_flight, rows = peak_activations(sched), len(Xp) // 8
for rank, layers in enumerate(stage_layers(len(pipe_mlp.sizes) - 1, c.size)):
    n_in, n_out = pipe_mlp.sizes[layers.start], sum(pipe_mlp.sizes[l + 1] for l in layers)
    assert kept.peak_activation_bytes[rank] == in_flight[rank] * rows * (n_in + n_out) * 8
    assert again.peak_activation_bytes[rank] == (in_flight[rank] * n_in + n_out) * rows * 8
saved = [k - a for k, a in zip(kept.peak_activation_bytes, again.peak_activation_bytes)]
assert all(s > 0 for s in saved[:-1]) and saved[-1] == 0 and saved[0] == max(saved)
print("PASS: every peak equals the formula; the same gradient bit for bit, twice the layer "
      "forwards, less activation memory on every rank but the last, the most on rank 0")

# %% [markdown]
# Rank 0 holds the most micro-batches in flight (1F1B: min(p, m) = 4), so it saves the most;
# the last stage holds one at a time and saves nothing. For a transformer, Korthikanti et
# al. (2022, arXiv:2205.05198) count $s b h (34 + 5 a s / h)$ bytes of 16-bit activations
# per layer without recomputation ($s$ tokens, $b$ sequences, hidden size $h$, $a$ heads):
# $34 s b h$ from the linear layers, LayerNorms and dropouts, and $5 a s^2 b$ from
# attention's $s \times s$ scores, softmax and its dropout mask. Full recomputation keeps
# only each layer's $2 s b h$ input, at the price of a whole extra forward (about a third
# more compute). Their contribution is to recompute **selectively**: only the attention
# term $5 a s^2 b$, which is large in memory but cheap in FLOPs, and to add **sequence
# parallelism**: with tensor parallelism over $t$ GPUs, the LayerNorms and dropouts that
# Megatron replicated are split along the sequence, so the $34 s b h$ term is divided by
# $t$ too. Together they keep $34 s b h / t$ bytes per layer and GPU, with no $s^2$ term, for a
# few percent more compute (their measurement on GPT models of 22B to 1T parameters) instead
# of full recomputation's third.
#
# ## 5. Does it fit?
#
# The panel puts it together for the models above: the memory per GPU of every ZeRO stage
# (the chosen one outlined), the GPU's capacity, and the time of a step from the FLOPs and
# the cost model of chapter 2 (ring collectives, a 5 µs latency and the link bandwidth you
# set). Try: the 7B model at stage 0 on 64 GPUs (does not fit), then stage 1, 2, 3; a
# longer sequence (`gpt-7b-4k`); recomputation; tensor parallelism inside a node.

# %%
from coursekit.widgets.memory import MemoryPanel

panel = MemoryPanel("gpt-7b-2k", precision="bf16", optimizer="adam", dp=64)
panel

# %% [markdown]
# ## When you are done
#
# The cluster keeps running until you shut down the kernel (Kernel > Shut Down Kernel):
# its cluster stops with it, even if the kernel is killed (a watchdog, `coursekit.cluster.reaper`,
# then ends the engines). To stop it now: `c.stop()`.
