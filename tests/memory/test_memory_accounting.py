"""Chapter 8, memory accounting: the papers' numbers, the presets, and the real MLP's bytes."""

import numpy as np
import pytest

from coursekit import costmodel
from coursekit.memory import (
    PRESETS,
    RESNET50,
    Kept,
    ModelShape,
    TrainingSetup,
    bytes_per_param,
    fused_step_transient_bytes,
    measure_mlp,
    memory_per_gpu,
    mlp_shape,
    step_time,
    transformer_shape,
)
from coursekit.nn import MLP
from coursekit.nn.flops import mlp_step_flops

GB = 1e9


def states_only(n_params):
    """A model whose activations cost nothing: only the model states count."""
    return ModelShape("states only", n_params, 1.0, Kept())


# -- model states: ZeRO (Rajbhandari et al. 2020) ---------------------------------------------

@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_zero_figure_1_per_gpu_memory(precision):
    """Figure 1: Ψ = 7.5B, N = 64, mixed-precision Adam (K = 12): 120, 31.4, 16.6, 1.9 GB."""
    psi, n = 7.5e9, 64
    paper = [120, 31.4, 16.6, 1.9]
    exact = [16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n]
    for stage in range(4):
        m = memory_per_gpu(states_only(7_500_000_000),
                           TrainingSetup(precision=precision, optimizer="adam", stage=stage, dp=n))
        assert m.total == exact[stage]
        assert m.total / GB == pytest.approx(paper[stage], abs=0.05)  # the paper rounds to 0.1 GB
        assert m.activations == 0


def test_bytes_per_param_mixed_precision_counts_the_fp32_master_with_the_optimizer():
    assert bytes_per_param("fp16", "adam") == (2, 2, 12)  # ZeRO's K = 12
    assert bytes_per_param("bf16", "momentum") == (2, 2, 8)
    assert bytes_per_param("bf16", "sgd") == (2, 2, 4)  # the master weights alone
    assert bytes_per_param("fp32", "adam") == (4, 4, 8)
    assert bytes_per_param("fp32", "sgd") == (4, 4, 0)
    assert bytes_per_param("fp64", "momentum") == (8, 8, 8)


def test_each_stage_partitions_its_category_and_tp_pp_divide_the_parameters():
    psi, n, t, p = 6_400_000, 4, 2, 5
    local = psi / (t * p)
    P, G, K = 2, 2, 12
    want = {0: (P * local, G * local, K * local),
            1: (P * local, G * local, K * local / n),
            2: (P * local, G * local / n, K * local / n),
            3: (P * local / n, G * local / n, K * local / n)}
    for stage, (params, grads, states) in want.items():
        m = memory_per_gpu(states_only(psi), TrainingSetup(stage=stage, dp=n, tp=t, pp=p))
        assert (m.parameters, m.gradients, m.optimizer_states) == (params, grads, states)


def test_fits_compares_the_total_with_the_gpu():
    gpt7b = PRESETS["gpt-7b-2k"]
    alone = memory_per_gpu(gpt7b, TrainingSetup(precision="bf16", optimizer="adam"))
    assert alone.parameters + alone.gradients + alone.optimizer_states == 16 * gpt7b.n_params
    assert not alone.fits(80e9)  # 105 GB of model states before any activation
    sharded = memory_per_gpu(gpt7b, TrainingSetup(stage=3, dp=8, recompute=True))
    assert sharded.fits(80e9) and not sharded.fits(sharded.total - 1)


# -- activations: Korthikanti et al. 2022 ------------------------------------------------------

def test_activations_per_layer_match_korthikanti_by_hand():
    """s = 4, b = 2, h = 8, a = 2, 16-bit, one layer: sbh = 64 and 5as/h = 5, so
    sbh(34 + 5as/h) = 64 * 39 = 2496; with t = 2: sbh(10 + 24/2 + 5as/(h*2)) = 1568;
    full recomputation: 2sbh = 128."""
    layer = transformer_shape("one layer", layers=1, hidden=8, heads=2, seq=4, vocab=11)
    acts = [memory_per_gpu(layer, TrainingSetup(precision="fp16", micro_batch=2, **kw)).activations
            for kw in ({}, {"tp": 2}, {"recompute": True})]
    assert acts == [2496, 1568, 128]


@pytest.mark.parametrize("name,seq", [("gpt-7b-2k", 2048), ("gpt-7b-4k", 4096)])
@pytest.mark.parametrize("b", [1, 3])
def test_7b_activations_are_korthikanti_per_layer_times_layers(name, seq, b):
    s, h, a, L = seq, 4096, 32, 32
    model = PRESETS[name]
    acts = memory_per_gpu(model, TrainingSetup(precision="bf16", micro_batch=b)).activations
    assert acts == L * s * b * h * (34 + 5 * a * s / h)
    for t in (2, 8):
        acts_t = memory_per_gpu(model, TrainingSetup(micro_batch=b, tp=t)).activations
        assert acts_t == L * s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    recomputed = memory_per_gpu(model, TrainingSetup(micro_batch=b, recompute=True)).activations
    assert recomputed == L * 2 * s * b * h
    # in fp32 the values double, the one-byte dropout masks (2sh + as^2 a layer) do not
    fp32 = memory_per_gpu(model, TrainingSetup(precision="fp32", micro_batch=b)).activations
    assert fp32 == 2 * acts - L * b * (2 * s * h + a * s * s)


def test_pipeline_keeps_min_p_m_micro_batches_of_its_share_of_the_layers():
    model = PRESETS["gpt2-small"]
    whole = memory_per_gpu(model, TrainingSetup(micro_batch=2)).activations
    for p, m, share in ((4, 4, 1), (4, 8, 1), (4, 2, 0.5), (4, 1, 0.25)):
        got = memory_per_gpu(model, TrainingSetup(micro_batch=2, pp=p, micro_batches=m))
        assert got.activations == whole * share
        assert got.parameters == 2 * model.n_params / p


# -- presets -----------------------------------------------------------------------------------

def test_transformer_presets_count_their_parameters():
    assert PRESETS["gpt2-small"].n_params == 124_439_808  # GPT-2 small, the "124M" model
    L, h, V = 32, 4096, 32000
    assert PRESETS["gpt-7b-2k"].n_params == L * (12 * h * h + 13 * h) + V * h + 2 * h
    assert PRESETS["gpt-7b-4k"].n_params == PRESETS["gpt-7b-2k"].n_params
    assert PRESETS["gpt-7b-2k"].flops_per_sample == 6 * PRESETS["gpt-7b-2k"].n_params * 2048


def test_resnet50_matches_torchsummary_and_a_hand_count_of_block_inputs():
    assert RESNET50.n_params == 25_557_032
    outputs = RESNET50.kept.values - 3 * 224 * 224  # torchsummary leaves out the input
    assert round(2 * outputs * 4 / 2**20, 2) == 286.56  # its "Forward/backward pass size (MB)"
    block_inputs = (3 * 224**2 + 64 * 56**2 + 2 * 256 * 56**2 + 256 * 56**2 + 3 * 512 * 28**2
                    + 512 * 28**2 + 5 * 1024 * 14**2 + 1024 * 14**2 + 2 * 2048 * 7**2 + 2048 * 7**2)
    assert RESNET50.checkpoint == Kept(block_inputs)
    recomputed = memory_per_gpu(RESNET50, TrainingSetup(precision="fp32", micro_batch=32,
                                                        recompute=True, tp=4))
    assert recomputed.activations == 32 * 4 * block_inputs


def test_mlp_shape_from_a_model_or_its_sizes_and_its_tensor_parallel_split():
    sizes = (64, 128, 10)
    assert mlp_shape(MLP(sizes)) == mlp_shape(sizes)
    shape = mlp_shape(sizes)
    assert shape.n_params == 64 * 128 + 128 + 128 * 10 + 10
    b = 5
    # X and the row-parallel output A^2 whole on each rank, the column-parallel A^1 split
    acts = memory_per_gpu(shape, TrainingSetup(precision="fp32", micro_batch=b, tp=2)).activations
    assert acts == 4 * b * (64 + 10 + 128 / 2)
    plain = memory_per_gpu(shape, TrainingSetup(precision="fp32", micro_batch=b))
    assert memory_per_gpu(shape, TrainingSetup(precision="fp32", micro_batch=b,
                                               recompute=True)) == plain  # nothing to recompute


# -- measured equals formula: chapter 1's MLP -------------------------------------------------

SIZES = [(64, 128, 10), (64, 32, 33, 17, 10), (300, 400, 300, 10)]  # the last: W^T not copied


@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_measured_mlp_bytes_equal_the_formula(sizes, dtype, optimizer):
    remainders = set()
    for b in (1, 7, 64):
        got = measure_mlp(sizes, micro_batch=b, dtype=dtype, optimizer=optimizer, seed=b)
        want = memory_per_gpu(mlp_shape(sizes), got.setup)
        assert got.memory == want  # every category, to the byte
        itemsize = np.dtype(dtype).itemsize
        assert want.activations == b * sum(sizes) * itemsize
        assert want.optimizer_states == (optimizer == "momentum") * want.parameters

        # the layer-by-layer step is the fused step
        mlp = MLP(sizes, dtype=dtype, seed=b)
        rng = np.random.default_rng(b)
        X = rng.standard_normal((b, sizes[0])).astype(dtype)
        _, fused = mlp.loss_and_grad(X, rng.integers(0, sizes[-1], b))
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got.grad, fused, rtol=tol, atol=tol)

        # the fused step's peak: kept A^1..A^L + the backward's transients + a constant
        kept_by_kernel = want.activations - b * sizes[0] * itemsize
        remainders.add(got.step_peak - kept_by_kernel
                       - fused_step_transient_bytes(sizes, b, dtype))
    # the batch-dependent part is exact: what remains moves by a few dozen bytes at most from
    # call to call (seen: 688 or 800 B depending on the net, the same for every b), while a
    # missed or extra term of b x width would move it by at least (64 - 1) x 10 x 4 = 2520 B
    # between b = 1 and 64
    assert max(remainders) - min(remainders) < 256, remainders
    assert 0 <= min(remainders) and max(remainders) < 4096  # Numba's array headers


# -- time per step -----------------------------------------------------------------------------

LINK = {"alpha": 5e-6, "beta": 1 / 25e9}


def test_step_time_is_flops_at_throughput_plus_the_cost_models_allreduce():
    model = PRESETS["gpt2-small"]
    setup = TrainingSetup(precision="bf16", dp=16, tp=2, pp=2, micro_batch=4, micro_batches=8)
    t = step_time(model, setup, flops_per_s=1e14, **LINK)
    tokens = 4 * 8 * 1024
    assert t.compute == 6 * model.n_params * tokens / 4 / 1e14
    assert t.bubble == t.compute * (2 - 1) / 8
    grad_bytes = 2 * model.n_params / 4
    assert t.communication == costmodel.predict("allreduce", "ring", 16, grad_bytes, **LINK)
    assert t.total == t.compute + t.bubble + t.communication
    for stage in (1, 2):  # reduce-scatter + all-gather: the allreduce's volume
        again = step_time(model, TrainingSetup(dp=16, tp=2, pp=2, micro_batch=4, micro_batches=8,
                                               stage=stage), flops_per_s=1e14, **LINK)
        assert again == t


def test_stage_3_sends_one_and_a_half_allreduces():
    model = PRESETS["gpt-7b-2k"]
    bandwidth_only = {"alpha": 0.0, "beta": 1 / 100e9}
    allreduce, stage3 = (step_time(model, TrainingSetup(stage=s, dp=64), flops_per_s=4e14,
                                   **bandwidth_only).communication for s in (0, 3))
    assert allreduce == 2 * 63 / 64 * 2 * model.n_params / 100e9
    assert stage3 == pytest.approx(1.5 * allreduce, rel=1e-12)
    assert step_time(model, TrainingSetup(stage=3), flops_per_s=4e14, **LINK).communication == 0


def test_recomputation_runs_the_forward_twice_where_there_is_something_to_recompute():
    for model, factor in ((PRESETS["gpt2-small"], 4 / 3), (mlp_shape((64, 128, 10)), 1)):
        plain, again = (step_time(model, TrainingSetup(recompute=r), flops_per_s=1e12, **LINK)
                        for r in (False, True))
        assert again.compute == pytest.approx(factor * plain.compute, rel=1e-15)


def test_mlp_six_psi_rule_against_chapter_1s_exact_matmul_flops():
    sizes, b = (64, 128, 10), 32
    rule = mlp_shape(sizes).flops_per_sample * b
    exact = mlp_step_flops(sizes, b)["total"]
    assert rule - exact == 6 * b * (128 + 10) + 2 * b * 64 * 128  # biases, skipped dC/dX


# -- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,error,words", [
    ({"precision": "fp8"}, ValueError, "allowed: fp64, fp32, fp16, bf16"),
    ({"precision": 16}, TypeError, "precision must be a string"),
    ({"optimizer": "adamw"}, ValueError, "allowed: sgd, momentum, adam"),
    ({"stage": 4}, ValueError, "stage=4"),
    ({"stage": True}, TypeError, "stage must be an integer"),
    ({"dp": 0}, ValueError, "dp=0"),
    ({"tp": 2.0}, TypeError, "tp must be an integer"),
    ({"micro_batches": 0}, ValueError, "micro_batches=0"),
    ({"recompute": "yes"}, TypeError, "recompute must be True or False"),
])
def test_bad_setups_say_what_is_allowed(kwargs, error, words):
    with pytest.raises(error, match=words):
        TrainingSetup(**kwargs)


def test_bad_shapes_and_arguments():
    with pytest.raises(ValueError, match="n_params=0"):
        ModelShape("empty", 0, 1.0, Kept())
    with pytest.raises(TypeError, match="kept must be a Kept"):
        ModelShape("x", 10, 1.0, kept=100)
    with pytest.raises(ValueError, match="multiple of heads"):
        transformer_shape("x", layers=2, hidden=10, heads=3, seq=8, vocab=5)
    with pytest.raises(TypeError, match="model must be a ModelShape"):
        memory_per_gpu("gpt-7b-2k", TrainingSetup())
    with pytest.raises(TypeError, match="setup must be a TrainingSetup"):
        memory_per_gpu(RESNET50, {"stage": 1})
    with pytest.raises(ValueError, match="gpu_bytes=0"):
        memory_per_gpu(RESNET50, TrainingSetup()).fits(0)
    with pytest.raises(ValueError, match="allowed: sgd, momentum"):
        measure_mlp((4, 3), micro_batch=2, optimizer="adam")
    with pytest.raises(ValueError, match="flops_per_s=0"):
        step_time(RESNET50, TrainingSetup(), flops_per_s=0, **LINK)
