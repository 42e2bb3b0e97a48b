"""The chapter-1 check accepts a correct backward pass and explains wrong ones."""

import numpy as np

from coursekit.grading.ch01 import check_layer_backward
from coursekit.nn import activations, reference


def test_reference_passes():
    result = check_layer_backward(reference.layer_backward, quiet=True)
    assert result, str(result)


def test_an_independent_per_sample_implementation_passes():
    """The lecture's column equations, one sample at a time, written without the reference."""

    def per_sample(W, a_prev, a, grad_a, activation):
        dW, db, g_prev = np.zeros_like(W), np.zeros(W.shape[1]), np.zeros_like(a_prev)
        for x in range(len(a_prev)):
            delta = grad_a[x] * activations.derivative(a[x], activation)
            dW += np.outer(a_prev[x], delta)
            db += delta
            g_prev[x] = W @ delta
        return dW, db, g_prev

    assert check_layer_backward(per_sample, quiet=True)


def test_stub_is_reported_as_todo(capsys):
    def stub(W, a_prev, a, grad_a, activation):
        raise NotImplementedError

    result = check_layer_backward(stub)
    assert result.status == "todo"
    assert "TODO  layer_backward" in capsys.readouterr().out


def test_forgotten_activation_derivative_fails_with_a_hint():
    def no_derivative(W, a_prev, a, grad_a, activation):
        return a_prev.T @ grad_a, grad_a.sum(axis=0), grad_a @ W.T

    result = check_layer_backward(no_derivative, quiet=True)
    assert result.status == "fail"
    assert "activation='relu'" in result.message and "dW differs from the reference" in result.message


def test_wrong_bias_axis_fails_on_shape():
    def wrong_axis(W, a_prev, a, grad_a, activation):
        dW, _, g = reference.layer_backward(W, a_prev, a, grad_a, activation)
        delta = grad_a * activations.derivative(a, activation)
        return dW, delta.sum(axis=1), g

    result = check_layer_backward(wrong_axis, quiet=True)
    assert result.status == "fail" and "db has shape" in result.message


def test_modifying_an_input_in_place_fails():
    def in_place(W, a_prev, a, grad_a, activation):
        grad_a *= activations.derivative(a, activation)  # overwrites the caller's array
        return a_prev.T @ grad_a, grad_a.sum(axis=0), grad_a @ W.T

    result = check_layer_backward(in_place, quiet=True)
    assert result.status == "fail" and "changed its input grad_a in place" in result.message


def test_a_network_mismatch_is_reported():
    calls = []

    def drifting(W, a_prev, a, grad_a, activation):  # right on single layers, wrong afterwards
        calls.append(1)
        dW, db, g = reference.layer_backward(W, a_prev, a, grad_a, activation)
        return (dW, db, g) if len(calls) <= 8 else (dW, db, 2 * g)

    result = check_layer_backward(drifting, quiet=True)
    assert result.status == "fail" and "chained through a 5-4-6-3 network" in result.message


def test_exceptions_are_reported_plainly():
    def broken(W, a_prev, a, grad_a, activation):
        return W @ a_prev  # shapes do not align

    result = check_layer_backward(broken, quiet=True)
    assert result.status == "fail" and "your function raised ValueError" in result.message


# ---- the two-layer backward pass from the chain rule (exercise 01_chain_rule) ----

from coursekit.grading.ch01 import check_two_layer_backward  # noqa: E402


def _two_layer(W1, b1, W2, b2, X, T, *, dsigma=lambda a: a * (1 - a), bias_sum=np.sum):
    """The rules written out independently of the library; the knobs make plausible mistakes."""
    a1 = 1 / (1 + np.exp(-(X @ W1 + b1)))
    g = {"z2": (a1 @ W2 + b2 - T) / len(X)}
    g["W2"], g["b2"], g["a1"] = a1.T @ g["z2"], bias_sum(g["z2"], axis=0), g["z2"] @ W2.T
    g["z1"] = g["a1"] * dsigma(a1)
    g["W1"], g["b1"] = X.T @ g["z1"], bias_sum(g["z1"], axis=0)
    return g


def test_an_independent_two_layer_backward_passes():
    result = check_two_layer_backward(_two_layer, quiet=True)
    assert result, str(result)


def test_the_library_passes_its_own_check():
    from coursekit.nn import chain_rule

    def library(W1, b1, W2, b2, X, T):
        return chain_rule.backward(chain_rule.TwoLayerNet(W1, b1, W2, b2, "sigmoid", "mse"), X, T)

    assert check_two_layer_backward(library, quiet=True)


def test_two_layer_stub_is_todo():
    def stub(W1, b1, W2, b2, X, T):
        raise NotImplementedError

    assert check_two_layer_backward(stub, quiet=True).status == "todo"


def test_a_wrong_sigmoid_derivative_is_named_at_z1():
    result = check_two_layer_backward(lambda *a: _two_layer(*a, dsigma=lambda a1: a1), quiet=True)
    assert result.status == "fail" and "dL/dz1 differs from central differences" in result.message
    assert "a1 (1 - a1)" in result.message


def test_a_mean_instead_of_a_sum_is_named_at_b2():
    result = check_two_layer_backward(lambda *a: _two_layer(*a, bias_sum=np.mean), quiet=True)
    assert result.status == "fail" and "dL/db2" in result.message and "sum rule" in result.message


def test_a_missing_gradient_and_a_wrong_type_are_named():
    def no_b1(*args):
        g = _two_layer(*args)
        del g["b1"]
        return g

    assert "the dict has no 'b1'" in check_two_layer_backward(no_b1, quiet=True).message
    assert "expected a dict" in check_two_layer_backward(lambda *a: list(_two_layer(*a).values()),
                                                         quiet=True).message


def test_two_layer_in_place_change_fails():
    def in_place(W1, b1, W2, b2, X, T):
        g = _two_layer(W1, b1, W2, b2, X, T)
        T -= 1
        return g

    result = check_two_layer_backward(in_place, quiet=True)
    assert result.status == "fail" and "changed its input T in place" in result.message
