"""The course's MLP as a torch module, with exactly its weights, and back to the flat buffer.

The course keeps layer l's weight as W_l of shape (n_in, n_out) and computes Z = A W_l + b_l
(:mod:`coursekit.nn.layout`); ``torch.nn.Linear`` keeps ``weight`` of shape (n_out, n_in)
and computes Z = A weight^T + bias. So ``weight = W_l^T`` and ``bias = b_l``, and the flat
buffer ``[W_1 | b_1 | ... | W_L | b_L]`` is read back as ``weight.T`` row-major, then
``bias``, layer after layer. Hidden layers get the MLP's activation, the last is linear;
the loss of ``"softmax_xent"`` is ``torch.nn.functional.cross_entropy`` (a mean over the
batch, like the course's).
"""

from __future__ import annotations

import numpy as np

from coursekit import checks
from coursekit.nn.mlp import MLP

from .requirement import import_torch

__all__ = ["course_names", "flat_params", "to_torch"]


def to_torch(mlp: MLP):
    """A ``torch.nn.Sequential`` of Linear layers (and the hidden activation) holding
    ``mlp``'s weights, in its dtype, on the CPU. Only ``loss="softmax_xent"`` is mapped."""
    checks.instance(mlp, "mlp", MLP, " (coursekit.nn.MLP)")
    if mlp.loss != "softmax_xent":
        raise ValueError(f"to_torch maps loss='softmax_xent' (torch's cross_entropy); got "
                         f"loss={mlp.loss!r}")
    torch = import_torch()
    act = {"relu": torch.nn.ReLU, "sigmoid": torch.nn.Sigmoid, "tanh": torch.nn.Tanh}
    dtype = torch.float64 if mlp.dtype == np.float64 else torch.float32
    modules = []
    for layer in mlp.layers:
        linear = torch.nn.Linear(*layer.W.shape, dtype=dtype)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(layer.W.T.copy()))
            linear.bias.copy_(torch.from_numpy(layer.b.copy()))
        modules.append(linear)
        if layer.activation != "identity":
            modules.append(act[layer.activation]())
    return torch.nn.Sequential(*modules)


def _linears(model):
    torch = import_torch()
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def flat_params(model) -> np.ndarray:
    """The course's flat buffer of a module made by :func:`to_torch` (or its DDP wrapper's
    ``.module``): ``weight.T`` row-major, then ``bias``, for every Linear in order."""
    parts = []
    for linear in _linears(model):
        parts += [linear.weight.detach().T.numpy().ravel(), linear.bias.detach().numpy()]
    return np.concatenate(parts)


def course_names(model) -> dict:
    """``id(parameter)`` -> the course's name of that torch parameter: ``W1``, ``b1``, ``W2`` ..."""
    names = {}
    for l, linear in enumerate(_linears(model), start=1):
        names[id(linear.weight)], names[id(linear.bias)] = f"W{l}", f"b{l}"
    return names
