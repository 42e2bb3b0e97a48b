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
