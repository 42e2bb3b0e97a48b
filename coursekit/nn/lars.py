"""LARS: layer-wise adaptive rate scaling (You, Gitman & Ginsburg 2017, arXiv:1708.03888).

Large global batches (the case study's 64K) need large learning rates, and one global
rate is then too large for some layers and too small for others. LARS gives every layer l
its own trust ratio on top of the global rate ``lr``::

    local_l = trust * ||w_l|| / (||g_l|| + weight_decay * ||w_l||)  (1 if ||w_l|| or ||g_l|| is 0)
    v_l <- momentum * v_l + lr * local_l * (g_l + weight_decay * w_l)
    w_l <- w_l - v_l

On the flat buffer a "layer" is a segment ``[start, stop)``; :func:`mlp_segments` gives
each MLP weight matrix its own segment and, as is usual, leaves biases out of the
adaptation (their ratio is 1: plain momentum SGD with weight decay 0). Jia et al. 2018
used LARS with mixed precision for their 64K batch.
"""

from __future__ import annotations

import numpy as np

from coursekit import checks
from coursekit.nn import layout
from coursekit.nn.optim import SGD

__all__ = ["LARS", "mlp_segments"]


def mlp_segments(sizes) -> list[tuple[int, int, bool]]:
    """``(start, stop, adapt)`` of every weight matrix (adapt=True) and bias (False)."""
    out = []
    for s in layout.layer_slices(sizes):
        out += [(s.start, s.w_stop, True), (s.w_stop, s.stop, False)]
    return out


class LARS(SGD):
    """LARS with momentum on the flat buffer; ``step(grad)`` like :class:`SGD`.

    ``segments``: ``(start, stop, adapt)`` triples that tile ``params`` in order (default:
    the whole buffer is one adapted layer). ``trust`` is LARS's eta (0.001 in the paper).
    """

    def __init__(self, params: np.ndarray, lr: float = 0.1, momentum: float = 0.9,
                 weight_decay: float = 0.0, trust: float = 0.001, segments=None):
        super().__init__(params, lr)
        self.momentum = checks.real(momentum, "momentum", at_least=0, below=1)
        self.weight_decay = checks.real(weight_decay, "weight_decay", at_least=0)
        self.trust = checks.real(trust, "trust", above=0)
        segs = [(0, self.params.size, True)] if segments is None else list(segments)
        self._starts, self._lengths, self._adapt = self._check_segments(segs)
        self.velocity = np.zeros_like(self.params)
        self.last_ratios = np.ones(len(segs))

    def _check_segments(self, segs):
        if not all(isinstance(seg, (tuple, list)) and len(seg) == 3 for seg in segs):
            raise ValueError(f"segments must be (start, stop, adapt) triples, e.g. "
                             f"mlp_segments(mlp.sizes); got {segs!r:.200}")
        stops = [0] + [stop for _, stop, _ in segs]
        starts = [start for start, _, _ in segs]
        if (not segs or starts != stops[:-1] or stops[-1] != self.params.size
                or any(stop <= start for start, stop, _ in segs)):
            raise ValueError(f"segments must be non-empty (start, stop, adapt) ranges that tile "
                             f"the {self.params.size} parameters in order; got {segs!r}")
        starts = np.array(starts)
        return starts, np.diff(stops), np.array([bool(a) for _, _, a in segs])

    def trust_ratios(self, grad: np.ndarray) -> np.ndarray:
        """local_l of every segment: 1 where not adapted or where ||w_l|| or ||g_l|| is 0
        (the guard of torchlars and apex's LARC: a layer without gradient is not rescaled,
        even with weight decay on)."""
        w = self.params.astype(np.float64)
        g = grad.astype(np.float64)
        w_norm = np.sqrt(np.add.reduceat(w * w, self._starts))
        g_norm = np.sqrt(np.add.reduceat(g * g, self._starts))
        ok = self._adapt & (w_norm > 0) & (g_norm > 0)
        denom = np.where(ok, g_norm + self.weight_decay * w_norm, 1.0)
        return np.where(ok, self.trust * w_norm / denom, 1.0)

    def step(self, grad: np.ndarray) -> None:
        self._check_grad(grad)
        self.last_ratios = self.trust_ratios(grad)
        scale = np.repeat(self.lr * self.last_ratios, self._lengths).astype(self.params.dtype)
        decay = np.where(np.repeat(self._adapt, self._lengths), self.weight_decay, 0.0)
        update = grad + decay.astype(self.params.dtype) * self.params
        self.velocity *= self.params.dtype.type(self.momentum)
        self.velocity += scale * update
        self.params -= self.velocity
