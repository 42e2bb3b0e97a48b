"""Optimizers that update the flat parameter buffer in place.

They see one vector of parameters and one vector of gradients, nothing else: that is
what makes data parallelism a one-line change (average the gradient vector across
workers, then step) and lets a parameter-server shard run the same optimizer on its range.

* SGD:            w <- w - lr * g                     (the lecture's w -> w - (eta/m) sum_x ...;
                                                       the 1/m is already inside g)
* SGD + momentum: v <- mu * v + g ;  w <- w - lr * v  (PyTorch's convention)
"""

from __future__ import annotations

import numpy as np

from coursekit import checks
from coursekit.nn import kernels_cpu

__all__ = ["SGD", "Momentum", "Scheduled", "make_optimizer"]


def _check_buffer(params) -> np.ndarray:
    if not isinstance(params, np.ndarray) or params.ndim != 1 or not params.flags.c_contiguous:
        raise TypeError("params must be the flat, contiguous 1-D parameter buffer (e.g. mlp.params)")
    if params.dtype not in (np.float32, np.float64):
        raise TypeError(f"params must be float32 or float64; got {params.dtype}")
    return params


class SGD:
    """Plain SGD on a flat buffer: ``step(grad)`` does params <- params - lr * grad."""

    def __init__(self, params: np.ndarray, lr: float = 0.1):
        self.params = _check_buffer(params)
        self.lr = checks.real(lr, "lr", above=0)

    def _check_grad(self, grad) -> None:
        if not isinstance(grad, np.ndarray):
            raise TypeError(f"grad must be a NumPy array matching params ({self.params.dtype} "
                            f"{self.params.shape}); got {type(grad).__name__}")
        if grad.shape != self.params.shape or grad.dtype != self.params.dtype:
            raise ValueError(
                f"grad must match params ({self.params.dtype} {self.params.shape}); "
                f"got {grad.dtype} {grad.shape}"
            )

    def step(self, grad: np.ndarray) -> None:
        self._check_grad(grad)
        kernels_cpu.sgd_update(self.params, grad, self.params.dtype.type(self.lr))


class Momentum(SGD):
    """SGD with (heavy-ball) momentum: v <- mu v + g; params <- params - lr v."""

    def __init__(self, params: np.ndarray, lr: float = 0.1, momentum: float = 0.9):
        super().__init__(params, lr)
        self.momentum = checks.real(momentum, "momentum", at_least=0, below=1)
        self.velocity = np.zeros_like(self.params)

    def step(self, grad: np.ndarray) -> None:
        self._check_grad(grad)
        t = self.params.dtype.type
        kernels_cpu.momentum_update(self.params, grad, self.velocity, t(self.lr), t(self.momentum))


def make_optimizer(params: np.ndarray, lr: float, momentum: float = 0.0) -> SGD:
    """SGD when ``momentum == 0``, Momentum otherwise."""
    if momentum == 0:
        return SGD(params, lr)
    return Momentum(params, lr, momentum)


class Scheduled:
    """An optimizer whose ``lr`` follows ``schedule(step)`` (step 0, 1, ... counts its steps).

    With ``LRSchedule(base, "linear_warmup", n, warmup_steps)`` of
    :mod:`coursekit.parallel.data_parallel.lr_rules` it is Goyal et al.'s gradual warm-up:
    the rate ramps from the small-batch rate to n times it, then stays there.
    """

    def __init__(self, optimizer, schedule):
        if not callable(getattr(optimizer, "step", None)) or not hasattr(optimizer, "lr"):
            raise TypeError(f"optimizer must have an lr and a step(grad) method; got {optimizer!r:.60}")
        if not callable(schedule):
            raise TypeError(f"schedule must be a function step -> lr; got {schedule!r:.60}")
        self.optimizer, self.schedule, self.steps = optimizer, schedule, 0

    @property
    def lr(self) -> float:
        return self.optimizer.lr

    def step(self, grad: np.ndarray) -> None:
        self.optimizer.lr = float(self.schedule(self.steps))
        self.steps += 1
        self.optimizer.step(grad)
