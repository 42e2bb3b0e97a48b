"""Activation functions sigma(z) and their derivatives, written with the output a = sigma(z).

Backpropagation needs sigma'(z^l) (lecture: delta^l = ((W^{l+1})^T delta^{l+1}) * sigma'(z^l)).
For the activations of this course the derivative is a function of the output alone,
so a layer only has to keep a^l, not z^l:

=========  ===========================  ================================
name       sigma(z)                     sigma'(z) written with a=sigma(z)
=========  ===========================  ================================
identity   z                            1
relu       max(z, 0)                    1 if a > 0 else 0
sigmoid    1 / (1 + exp(-z))            a (1 - a)
tanh       tanh(z)                      1 - a^2
=========  ===========================  ================================

The integer codes are what the Numba and CUDA kernels branch on.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ACTIVATIONS", "HIDDEN_ACTIVATIONS", "activation_code", "apply", "derivative"]

#: every activation a layer may have; the position is the kernels' integer code
ACTIVATIONS = ("identity", "relu", "sigmoid", "tanh")
#: the ones a user may pick for hidden layers (the output layer is always "identity")
HIDDEN_ACTIVATIONS = ACTIVATIONS[1:]

IDENTITY, RELU, SIGMOID, TANH = range(len(ACTIVATIONS))


def activation_code(name: str, argname: str = "activation", allowed=ACTIVATIONS) -> int:
    """The kernels' integer code for ``name``; ValueError naming ``argname`` otherwise."""
    if not isinstance(name, str) or name not in allowed:
        raise ValueError(f"{argname}={name!r} is not supported; allowed: {', '.join(allowed)}")
    return ACTIVATIONS.index(name)


def apply(z: np.ndarray, name: str) -> np.ndarray:
    """a = sigma(z) for the activation ``name`` (a new array)."""
    code = activation_code(name)
    if code == IDENTITY:
        return z.copy()
    if code == RELU:
        return np.maximum(z, 0)
    if code == SIGMOID:
        # 1/(1+exp(-z)) overflows for very negative z; this split form never does
        ez = np.exp(-np.abs(z))
        return np.where(z >= 0, 1 / (1 + ez), ez / (1 + ez)).astype(z.dtype, copy=False)
    return np.tanh(z)


def derivative(a: np.ndarray, name: str) -> np.ndarray:
    """sigma'(z) computed from the output a = sigma(z) (see the table above)."""
    code = activation_code(name)
    if code == IDENTITY:
        return np.ones_like(a)
    if code == RELU:
        return (a > 0).astype(a.dtype)
    if code == SIGMOID:
        return a * (1 - a)
    return 1 - a * a
