"""The work of one training iteration per layer type: the lecture's CNN table, computed.

For a mini-batch of N images, a layer with C (C_in) input channels of H x W pixels and
C_out output channels of H' x W' pixels, and K_x x K_y kernels, the lecture (COMP4007,
"CNN workloads, one iteration"; Ben-Nun & Hoefler 2019) gives the work of the forward
output y, the weight gradient dw and the input gradient dx:

=====================  ==============================  ==============================  ==============================
layer                  y                               dw                              dx
=====================  ==============================  ==============================  ==============================
activation             N C H W                         N C H W                         N C H W
pooling                N C H W                         (no weights)                    N C H W
batch normalization    N C H W                         N C H W                         N C H W
fully connected        C_out C_in N                    C_in N C_out                    C_in C_out N
convolution (direct)   N C_out C_in H' W' K_x K_y      N C_out C_in H' W' K_x K_y      N C_out C_in H W K_x K_y
=====================  ==============================  ==============================  ==============================

The table gives orders (O(.)); :func:`layer_work` returns the leading term with constant 1,
which for the fully connected and convolution rows is the exact number of multiply-
accumulates (MACs, 2 FLOPs each): a fully connected layer's y = x W is N C_in C_out MACs,
and so are dW = x^T delta and dx = delta W^T (the three matrix products of
:mod:`coursekit.nn.flops`). For a convolution each output pixel of each output channel sums
C_in K_x K_y products. The table's dx uses the input size H W: a direct loop over the input
pixels; at stride 1 with "same" padding H' W' = H W and the three rows are equal, at stride
s the loop visits s^2 times more (pixel, tap) pairs than there are non-zero terms (the
non-zero ones number exactly y's MACs). The elementwise rows (activation, pooling, batch
norm) are O(N C H W) with a small constant per element and no MACs of any product.
"""

from __future__ import annotations

from dataclasses import dataclass

from coursekit import checks

__all__ = ["ELEMENTWISE", "LayerWork", "conv_work", "elementwise_work", "fc_work", "training_macs"]

#: the elementwise layer types of the table: activation and batch norm have dw rows (batch
#: norm's scale and shift; an activation's row is its parameter-free elementwise derivative)
ELEMENTWISE = ("activation", "pooling", "batch_norm")


@dataclass(frozen=True)
class LayerWork:
    """Work of one layer in one iteration: forward y, weight gradient dw, input gradient dx
    (dw is None for a layer without weights)."""

    layer: str
    y: int
    dw: int | None
    dx: int

    @property
    def total(self) -> int:
        return self.y + (self.dw or 0) + self.dx


def _pos(value, name):
    return checks.integer(value, name, at_least=1)


def elementwise_work(layer: str, n: int, c: int, h: int, w: int) -> LayerWork:
    """Activation, pooling or batch norm on N x C x H x W: O(N C H W) for each row."""
    if layer not in ELEMENTWISE:
        raise ValueError(f"layer={layer!r} is not elementwise; allowed: {', '.join(ELEMENTWISE)}")
    size = _pos(n, "n") * _pos(c, "c") * _pos(h, "h") * _pos(w, "w")
    return LayerWork(layer, size, None if layer == "pooling" else size, size)


def fc_work(n: int, c_in: int, c_out: int) -> LayerWork:
    """Fully connected: N C_in C_out MACs for each of y, dw and dx."""
    macs = _pos(n, "n") * _pos(c_in, "c_in") * _pos(c_out, "c_out")
    return LayerWork("fully_connected", macs, macs, macs)


def conv_work(n: int, c_in: int, c_out: int, h: int, w: int, kx: int, ky: int, stride: int = 1,
              padding: int | None = None) -> LayerWork:
    """Direct convolution of N x C_in x H x W with C_out kernels of K_x x K_y.

    H' = (H + 2 padding - K_y) // stride + 1 (likewise W'); ``padding=None`` is "same"
    padding for odd kernels, (K - 1) // 2. y = dw = N C_out C_in H' W' K_x K_y MACs and
    dx = N C_out C_in H W K_x K_y, as in the lecture's table.
    """
    n, c_in, c_out, h, w = (_pos(v, name) for v, name in ((n, "n"), (c_in, "c_in"), (c_out, "c_out"),
                                                          (h, "h"), (w, "w")))
    kx, ky, stride = _pos(kx, "kx"), _pos(ky, "ky"), _pos(stride, "stride")
    pad_y = (ky - 1) // 2 if padding is None else checks.integer(padding, "padding", at_least=0)
    pad_x = (kx - 1) // 2 if padding is None else pad_y
    h_out, w_out = (h + 2 * pad_y - ky) // stride + 1, (w + 2 * pad_x - kx) // stride + 1
    if h_out < 1 or w_out < 1:
        raise ValueError(f"a {kx}x{ky} kernel does not fit a {h}x{w} input with padding {padding}")
    per_pixel = n * c_out * c_in * kx * ky
    return LayerWork("convolution", per_pixel * h_out * w_out, per_pixel * h_out * w_out, per_pixel * h * w)


def training_macs(layers, *, first_input_grad: bool = False) -> dict[str, int]:
    """{"forward", "backward", "total"} of a network's product layers (fully connected and
    convolution :class:`LayerWork`, in forward order): forward = sum of y, backward = sum of
    dw + dx, without the first layer's dx (a gradient with respect to the data) unless
    ``first_input_grad``."""
    layers = list(layers)
    if not layers or not all(isinstance(l, LayerWork) and l.layer in ("fully_connected", "convolution")
                             for l in layers):
        raise ValueError("layers must be a non-empty list of fully connected or convolution LayerWork")
    forward = sum(l.y for l in layers)
    backward = sum(l.dw + l.dx for l in layers) - (0 if first_input_grad else layers[0].dx)
    return {"forward": forward, "backward": backward, "total": forward + backward}
