"""The course's MLP (:class:`coursekit.nn.MLP`) as a torch module with the same numbers.

A course layer computes Z = A W + b with W stored (n_in, n_out) in the flat buffer
(:mod:`coursekit.nn.layout`); torch's ``nn.Linear`` stores W^T (n_out, n_in). The
:class:`CourseLinear` layer keeps the course's orientation, so a parameter's gradient
*is* the course's gradient matrix (a DDP hook that views it as ``(rows, -1)``, like
PowerSGD's, sees the course's M of n_in x n_out), and copying the flat buffer in and out
is a reshape. Hidden layers use the MLP's activation, the last layer is linear and the
loss is the mean cross-entropy over the batch (the course's ``softmax_xent``).
"""

from __future__ import annotations

import numpy as np

from .requirement import import_torch

ACTIVATIONS = {"relu": "ReLU", "tanh": "Tanh", "sigmoid": "Sigmoid"}


def layers_module(mlp, layers):
    """``torch.nn.Sequential`` of ``mlp``'s layers ``layers`` (a range of indices), float64
    copies of their W and b; the hidden ones followed by the MLP's activation."""
    torch = import_torch()
    nn = torch.nn

    class CourseLinear(nn.Module):
        """Z = A W + b with W of shape (n_in, n_out), the course's layout."""

        def __init__(self, W, b):
            super().__init__()
            self.weight = nn.Parameter(torch.tensor(np.array(W), dtype=torch.float64))
            self.bias = nn.Parameter(torch.tensor(np.array(b), dtype=torch.float64))

        def forward(self, a):
            return torch.addmm(self.bias, a, self.weight)

    if mlp.activation not in ACTIVATIONS:
        raise ValueError(f"activation {mlp.activation!r} has no torch twin here; allowed: "
                         f"{', '.join(ACTIVATIONS)}")
    if mlp.loss != "softmax_xent":
        raise ValueError(f"loss {mlp.loss!r}: only 'softmax_xent' (torch's cross_entropy) is "
                         "mirrored")
    parts = []
    for l in layers:
        layer = mlp.layers[l]
        parts.append(CourseLinear(layer.W, layer.b))
        if l < len(mlp.layers) - 1:
            parts.append(getattr(nn, ACTIVATIONS[mlp.activation])())
    return nn.Sequential(*parts)


def loss_fn(output, target):
    """The course's loss: mean softmax cross-entropy over the rows."""
    torch = import_torch()
    return torch.nn.functional.cross_entropy(output, target)


def _linears(module):
    return [m for m in module if hasattr(m, "weight")]


def flat(module, mlp, layers, *, grad: bool = False) -> np.ndarray:
    """The module's parameters (``grad=True``: their gradients) in ``mlp``'s flat layout:
    a full-size buffer with ``layers`` filled and zeros elsewhere."""
    out = np.zeros(mlp.n_params, np.float64)
    for l, lin in zip(layers, _linears(module)):
        w, b = (lin.weight.grad, lin.bias.grad) if grad else (lin.weight, lin.bias)
        span = mlp.layers[l].span
        out[span] = np.concatenate([w.detach().numpy().ravel(), b.detach().numpy()])
    return out


def sgd_step(module, lr: float) -> None:
    """w <- w - lr * dC/dw for every parameter; then the gradients are cleared."""
    torch = import_torch()
    with torch.no_grad():
        for param in module.parameters():
            param -= lr * param.grad
            param.grad = None
