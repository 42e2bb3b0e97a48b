"""Error feedback: what compression dropped this step is added to the next gradient.

With compressor C, gradient g_t and residual e_t (e_0 = 0), every step

    x_t     = g_t + e_t          (compensate)
    sent_t  = C(x_t)             (what this worker contributes, decompressed)
    e_{t+1} = x_t - sent_t       (update)

so, telescoping, sum_t sent_t + e_T = sum_t g_t: nothing is lost, only delayed. This is
EF-SGD (Seide et al. 2014's 1-bit SGD; Karimireddy et al., ICML 2019; Stich et al.,
NeurIPS 2018). The residual is kept in gradient units, which equals the papers'
"lr * g" form for a constant learning rate.
"""

from __future__ import annotations

import numpy as np

from coursekit import checks


class NoMemory:
    """No error feedback: compensate(g) = g; what compression drops is lost."""

    residual = None

    def compensate(self, grad: np.ndarray) -> np.ndarray:
        return grad

    def update(self, compensated: np.ndarray, sent: np.ndarray) -> None:
        pass


class ErrorFeedback(NoMemory):
    """Residual memory: compensate(g) = g + e; update(x, sent) sets e = x - sent."""

    def __init__(self):
        self.residual: np.ndarray | None = None

    def compensate(self, grad: np.ndarray) -> np.ndarray:
        if self.residual is None:
            return grad.copy()
        if self.residual.shape != grad.shape or self.residual.dtype != grad.dtype:
            raise ValueError(f"the gradient ({grad.dtype} {grad.shape}) does not match the "
                             f"residual ({self.residual.dtype} {self.residual.shape}): one "
                             "ErrorFeedback per gradient buffer")
        return grad + self.residual

    def update(self, compensated: np.ndarray, sent: np.ndarray) -> None:
        self.residual = compensated - sent


def make_memory(error_feedback: bool) -> NoMemory:
    """ErrorFeedback() when ``error_feedback`` else NoMemory()."""
    return ErrorFeedback() if checks.boolean(error_feedback, "error_feedback") else NoMemory()
