"""INT8 inference: quantize a trained MLP's weights (and, at run time, its activations).

Per output column j of a weight matrix W (n_in x n_out), symmetric quantization:

    s_j = max_i |W_ij| / 127,   Q_ij = round(W_ij / s_j)  in [-127, 127]  (int8)

Biases stay float32 (n_out numbers per layer, a rounding error of the model's size). At
inference each layer's input a is quantized the same way with one dynamic scale
s_a = max|a| / 127, the product is taken in integers (int8 x int8, accumulated in int32, as
INT8 GEMM kernels on CPUs and GPUs do) and scaled back:

    z = (Q_a @ Q_W) * (s_a s_j) + b,   a_next = sigma(z)

Size: 1 byte per weight + 4 per scale and bias, against 4 bytes per parameter in float32:
close to 4x smaller. The accuracy cost on digits is a fraction of a point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit.nn import activations

QMAX = 127


def quantize_symmetric(a: np.ndarray, axis=None) -> tuple[np.ndarray, np.ndarray]:
    """(int8 codes, float32 scales) with a ~ codes * scales; scales = max|a| / 127 along
    ``axis`` reduced (None: one scale; 0: one per column). An all-zero slice gets scale 1."""
    peak = np.abs(a).max(axis=axis, keepdims=axis is not None).astype(np.float32)
    scale = np.where(peak > 0, peak / QMAX, 1).astype(np.float32)
    codes = np.clip(np.rint(a / scale), -QMAX, QMAX).astype(np.int8)
    return codes, scale


@dataclass(frozen=True)
class Int8MLP:
    """An MLP with int8 weights, per-column float32 scales and float32 biases."""

    weights: tuple  # int8 (n_in, n_out) per layer
    scales: tuple   # float32 (1, n_out) per layer
    biases: tuple   # float32 (n_out,) per layer
    activation: str

    @property
    def nbytes(self) -> int:
        """Bytes of the model: the int8 weights, their scales and the biases."""
        return sum(a.nbytes for group in (self.weights, self.scales, self.biases) for a in group)

    def forward(self, X) -> np.ndarray:
        """Outputs (logits) with int8 x int8 -> int32 products in every layer."""
        a = np.asarray(X, dtype=np.float32)
        last = len(self.weights) - 1
        for i, (q, s, b) in enumerate(zip(self.weights, self.scales, self.biases)):
            qa, sa = quantize_symmetric(a)
            z = (qa.astype(np.int32) @ q.astype(np.int32)) * (sa * s) + b
            a = z if i == last else activations.apply(z, self.activation)
        return a

    def predict(self, X) -> np.ndarray:
        return np.argmax(self.forward(X), axis=1)

    def accuracy(self, X, y) -> float:
        return float(np.mean(self.predict(X) == np.asarray(y)))


def quantize_mlp(mlp) -> Int8MLP:
    """The INT8 version of a trained :class:`coursekit.nn.MLP` (per-column weight scales)."""
    weights, scales = zip(*(quantize_symmetric(layer.W, axis=0) for layer in mlp.layers))
    biases = tuple(layer.b.astype(np.float32) for layer in mlp.layers)
    return Int8MLP(weights, scales, biases, mlp.activation)


@dataclass(frozen=True)
class InferenceReport:
    """Test accuracy and model size, float32 against INT8."""

    float_accuracy: float
    int8_accuracy: float
    float_bytes: int
    int8_bytes: int

    @property
    def size_ratio(self) -> float:
        return self.float_bytes / self.int8_bytes


def int8_report(mlp, X, y) -> InferenceReport:
    """Quantize ``mlp`` and compare it with the float model on (X, y)."""
    q = quantize_mlp(mlp)
    return InferenceReport(mlp.accuracy(X, y), q.accuracy(X, y),
                           int(mlp.params.nbytes), q.nbytes)
