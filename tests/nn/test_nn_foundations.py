"""Chapter 1's foundations: the chain rule, the descent lemma, batch sizes, model selection,
the lecture's per-layer work table. Each checked against an independent formula."""

import math

import numpy as np
import pytest

from coursekit.data import Dataset
from coursekit.nn import MLP, batch_size, chain_rule, descent, flops, layer_work, model_selection, reference


def small_problem(loss="softmax_xent", activation="tanh", seed=0):
    rng = np.random.default_rng(seed)
    net = chain_rule.TwoLayerNet.random(5, 4, 3, activation=activation, loss=loss, seed=rng)
    X = rng.standard_normal((6, 5))
    y = rng.integers(0, 3, 6) if loss == "softmax_xent" else rng.standard_normal((6, 3))
    return net, X, y


@pytest.mark.parametrize("loss", ["softmax_xent", "mse"])
@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh"])
def test_every_intermediate_matches_central_differences(loss, activation):
    net, X, y = small_problem(loss, activation)
    grads = chain_rule.backward(net, X, y)
    for name in chain_rule.INTERMEDIATES:
        numeric = chain_rule.numeric_gradient(net, X, y, name)
        assert grads[name].shape == numeric.shape
        assert np.max(np.abs(grads[name] - numeric)) <= 1e-7 * max(1, np.max(np.abs(numeric))), name


def test_weight_gradients_equal_the_reference():
    net, X, y = small_problem()
    grads = chain_rule.backward(net, X, y)
    params = np.concatenate([net.W1.ravel(), net.b1, net.W2.ravel(), net.b2])
    loss, flat = reference.loss_and_grad(params, (5, 4, 3), "tanh", "softmax_xent", X, y)
    assert chain_rule.forward(net, X, y)["loss"] == pytest.approx(loss)
    assert np.allclose(np.concatenate([grads[k].ravel() for k in ("W1", "b1", "W2", "b2")]), flat)


def test_two_layer_net_rejects_bad_input():
    net, X, y = small_problem()
    with pytest.raises(ValueError, match="shapes do not chain"):
        chain_rule.TwoLayerNet(net.W1, net.b1, net.W2.T, net.b2)
    with pytest.raises(ValueError, match="activation"):
        chain_rule.TwoLayerNet(net.W1, net.b1, net.W2, net.b2, activation="identity")
    with pytest.raises(ValueError, match="loss"):
        chain_rule.TwoLayerNet(net.W1, net.b1, net.W2, net.b2, loss="hinge")
    with pytest.raises(TypeError, match="W1 must be a NumPy array"):
        chain_rule.TwoLayerNet([[1.0]], net.b1, net.W2, net.b2)
    with pytest.raises(ValueError, match="not an intermediate"):
        chain_rule.numeric_gradient(net, X, y, "z3")


def test_a_small_step_matches_the_first_order_prediction_and_a_large_one_fails():
    net, X, y = small_problem()
    g = chain_rule.backward(net, X, y)
    norm2 = sum(np.sum(g[k] ** 2) for k in ("W1", "b1", "W2", "b2"))
    _, predicted, actual = descent.step(net, X, y, 1e-4)
    assert predicted == pytest.approx(-1e-4 * norm2)
    assert actual == pytest.approx(predicted, rel=1e-2)
    sweep = descent.lr_sweep(net, X, y, np.geomspace(1e-3, 1e3, 25))
    assert np.all(sweep.predicted < 0)
    rise = sweep.first_rise
    assert rise is not None and np.all(sweep.actual[sweep.lrs < rise] < 0) and sweep.actual[-1] > 0


def test_gd_steps_record_the_loss_before_each_step():
    net, X, y = small_problem()
    steps = descent.gd_steps(net, X, y, 0.1, 3)
    assert np.allclose(np.diff(steps.loss), steps.actual[:-1])
    assert np.all(steps.rel_error < 0.2)
    with pytest.raises(ValueError, match="ascending"):
        descent.lr_sweep(net, X, y, [0.1, 0.01])
    with pytest.raises(ValueError, match="lr"):
        descent.step(net, X, y, 0)


@pytest.fixture(scope="module")
def tiny_data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 6))
    y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0)
    return Dataset("tiny", X[:40], y[:40], X[40:], y[40:], 3)


def test_batch_sizes_count_updates_and_activation_bytes(tiny_data):
    config = batch_size.BatchConfig(batch_sizes=(1, 7, 40), epochs=2, hidden=5)
    runs = batch_size.compare_batch_sizes(config, tiny_data)
    for run, b in zip(runs, (1, 7, 40)):
        assert run.updates_per_epoch == math.ceil(40 / b) == batch_size.updates_per_epoch(40, b)
        assert run.activation_bytes == b * (6 + 5 + 3) * 8
        assert run.lr == pytest.approx(0.1 * math.sqrt(b / 32))
        assert len(run.loss) == len(run.seconds) == 2 and np.all(np.diff(run.seconds) > 0)
        assert run.gap == run.train_accuracy - run.test_accuracy


def test_the_full_batch_run_is_gradient_descent(tiny_data):
    config = batch_size.BatchConfig(batch_sizes=(40,), epochs=3, hidden=5, lr_rule="constant")
    run, = batch_size.compare_batch_sizes(config, tiny_data)
    init_seed, _ = np.random.SeedSequence(0).spawn(2)
    model = MLP([6, 5, 3], "relu", dtype=np.float64, seed=np.random.default_rng(init_seed))
    X = np.ascontiguousarray(tiny_data.X_train)
    for _ in range(3):  # plain GD: the order of the rows does not change a full-batch gradient
        model.params -= 0.1 * model.loss_and_grad(X, tiny_data.y_train)[1]
    assert run.loss[-1] == pytest.approx(model.loss_and_grad(X, tiny_data.y_train)[0], rel=1e-9)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"batch_sizes": ()}, TypeError, "batch_sizes"),
    ({"batch_sizes": (0,)}, ValueError, "batch_sizes"),
    ({"lr_rule": "cubic"}, ValueError, "lr_rule"),
    ({"epochs": 0}, ValueError, "epochs"),
    ({"activation": "identity"}, ValueError, "activation"),
])
def test_batch_config_rejects_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        batch_size.BatchConfig(**kwargs)


def test_batch_larger_than_the_data_is_refused(tiny_data):
    with pytest.raises(ValueError, match="at most the 40 training rows"):
        batch_size.compare_batch_sizes(batch_size.BatchConfig(batch_sizes=(41,)), tiny_data)


def test_validation_curve_chooses_the_validation_argmax(tiny_data):
    config = model_selection.ValidationConfig(widths=(1, 4, 8), epochs=3, val_fraction=0.25)
    curve = model_selection.validation_curve(config, tiny_data)
    assert curve.n_fit + curve.n_val == 40 and curve.n_val == 10
    assert curve.chosen == config.widths[int(np.argmax(curve.val_accuracy))]
    assert 0 <= curve.test_accuracy <= 1 and len(curve.train_accuracy) == 3
    with pytest.raises(ValueError, match="widths"):
        model_selection.ValidationConfig(widths=(0,))
    with pytest.raises(ValueError, match="val_fraction"):
        model_selection.ValidationConfig(val_fraction=1.0)


def test_fc_rows_equal_the_mlp_step_flops():
    for sizes, n in (((784, 256, 10), 256), ((64, 32, 16, 10), 7)):
        layers = [layer_work.fc_work(n, a, b) for a, b in zip(sizes[:-1], sizes[1:])]
        for first in (False, True):
            macs = layer_work.training_macs(layers, first_input_grad=first)
            assert {k: 2 * v for k, v in macs.items()} == flops.mlp_step_flops(sizes, n, first_input_grad=first)


def test_conv_rows_equal_resnet50_layer_macs_and_the_direct_loop():
    from coursekit.sim import resnet50

    macs = {layer.name: layer.macs for layer in resnet50.layers()}
    assert layer_work.conv_work(1, 3, 64, 224, 224, 7, 7, stride=2).y == macs["conv1"]
    assert layer_work.conv_work(1, 64, 64, 56, 56, 3, 3).y == macs["conv2_1b"]
    assert layer_work.conv_work(1, 256, 128, 56, 56, 1, 1, stride=2).y == macs["conv3_1a"]
    # the direct convolution, looped: one MAC per (image, out channel, in channel, output pixel, tap)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3))
    count, out = 0, np.zeros((2, 4, 4, 4))
    for i, j in np.ndindex(4, 4):
        out[:, :, i, j] = np.einsum("ncab,kcab->nk", x[:, :, i:i + 3, j:j + 3], w)
        count += 2 * 4 * 3 * 3 * 3
    work = layer_work.conv_work(2, 3, 4, 6, 6, 3, 3, padding=0)
    assert work.y == work.dw == count and work.dx == 2 * 4 * 3 * 6 * 6 * 9
    same = layer_work.conv_work(2, 3, 4, 6, 6, 3, 3)
    assert same.y == same.dw == same.dx  # stride 1, same padding: H'W' = HW


def test_elementwise_rows_and_bad_input():
    assert layer_work.elementwise_work("activation", 2, 3, 4, 5).total == 3 * 120
    pool = layer_work.elementwise_work("pooling", 2, 3, 4, 5)
    assert pool.dw is None and pool.total == 240
    with pytest.raises(ValueError, match="not elementwise"):
        layer_work.elementwise_work("convolution", 1, 1, 1, 1)
    with pytest.raises(ValueError, match="does not fit"):
        layer_work.conv_work(1, 1, 1, 2, 2, 5, 5, padding=0)
    with pytest.raises(ValueError, match="n"):
        layer_work.fc_work(0, 1, 1)
    with pytest.raises(ValueError, match="fully connected or convolution"):
        layer_work.training_macs([pool])
