"""A multilayer perceptron whose parameters live in ONE flat buffer.

``mlp.params`` is a 1-D array (float32 by default); ``mlp.layers[i].W`` and ``.b`` are
views into it, in the order of :mod:`coursekit.nn.layout`. Gradients come back as one
flat buffer of the same layout, so the later chapters can allreduce it in one call,
bucket it by slicing, shard it by ranges and compress it as a single vector.

Hidden layers use ``activation``; the output layer is linear and the loss is either
softmax + cross-entropy on integer labels, or (1/2) squared error ("mse") on targets
(integer labels are one-hot encoded for it). Both losses are means over the batch.

The compute runs in :mod:`coursekit.nn.kernels_cpu` (Numba) or, with ``device="cuda"``,
:mod:`coursekit.nn.kernels_cuda`; both have the signatures used here, and
:mod:`coursekit.nn.reference` is the plain-NumPy version of the same equations.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.nn import activations, kernels_cpu, layout

__all__ = ["DEVICES", "LOSSES", "MLP", "Layer", "check_device", "check_dtype", "device_name",
           "resolve_device"]

LOSSES = ("softmax_xent", "mse")
DEVICES = ("cpu", "cuda", "auto")
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_EMPTY = {dt: np.empty((0, 0), dtype=dt) for dt in DTYPES}


def check_device(device) -> str:
    """``device`` itself if it is one of :data:`DEVICES`, else a ValueError listing them.

    Only the value is checked (no GPU is looked for): a notebook without a GPU can
    configure a run whose engines have one. :func:`resolve_device` looks."""
    if not isinstance(device, str) or device not in DEVICES:
        raise ValueError(f"device={device!r} is not supported; allowed: {', '.join(DEVICES)} "
                         f"(cuda: this process's GPU, on an engine the GPU of its local rank; "
                         f"auto: the GPU when numba finds one, else the CPU)")
    return device


def resolve_device(device: str) -> str:
    """"cpu", or "cuda" when asked for (and present); "auto" picks "cuda" when a GPU is usable.

    On a cluster engine the first GPU use binds the GPU of the engine's local rank.
    """
    if check_device(device) == "cpu":
        return "cpu"
    from numba import cuda  # imported only when a GPU is asked for: it is slow to import

    if cuda.is_available():
        from coursekit.nn.kernels_cuda import bind_engine_gpu

        bind_engine_gpu()
        return "cuda"
    if device == "auto":
        return "cpu"
    raise ValueError(
        "device='cuda' but numba finds no usable CUDA GPU; use device='cpu' or device='auto' "
        "(or set NUMBA_ENABLE_CUDASIM=1 before importing numba to run the kernels in the simulator)"
    )


def device_name(device: str) -> str:
    """Where a model built for the resolved ``device`` computes, as this thread sees it:
    "cpu", or "cuda:<id>" with the id of the GPU numba's current context is on (the one
    :func:`~coursekit.nn.kernels_cuda.bind_engine_gpu` chose on an engine)."""
    if device == "cpu":
        return "cpu"
    from numba import cuda

    context = cuda.current_context()  # the simulator's context has the id, a real one its device
    return f"cuda:{getattr(context.device, 'id', getattr(context, 'id', 0))}"


def check_dtype(dtype) -> np.dtype:
    """``dtype`` as a NumPy dtype if it is float32 or float64 (the buffers' types):
    :func:`coursekit.checks.float_dtype`."""
    return checks.float_dtype(dtype)


@dataclass(frozen=True)
class Layer:
    """One layer: ``W`` (n_in, n_out) and ``b`` (n_out,) are views into the MLP's flat buffer.

    ``span`` is the layer's range in that buffer (W then b), so ``grad[layer.span]`` is its
    gradient. ``forward`` and ``backward`` run this layer alone (for pipeline and tensor
    parallel stages); they take and return host NumPy arrays.
    """

    index: int
    W: np.ndarray
    b: np.ndarray
    activation: str
    span: slice
    _backend: object

    @property
    def _act(self) -> int:
        return activations.ACTIVATIONS.index(self.activation)

    def forward(self, a_prev: np.ndarray) -> np.ndarray:
        """A = sigma(A_prev W + b)."""
        a_prev = np.ascontiguousarray(a_prev, dtype=self.W.dtype)
        out = np.empty((a_prev.shape[0], self.W.shape[1]), dtype=self.W.dtype)
        return self._backend.layer_forward(self.W, self.b, a_prev, self._act, out)

    def backward(self, a_prev, a, grad_a, grad=None, input_grad: bool = True):
        """Given G = dC/dA (the upstream delta), return (dC/dA_prev or None, this layer's grad).

        ``grad`` is an optional flat buffer of length W.size + b.size to write dW then db
        into (e.g. ``full_grad[layer.span]``); a new one is made when it is None.
        """
        dt = self.W.dtype
        n_in, n_out = self.W.shape
        if grad is None:
            grad = np.empty(n_out * (n_in + 1), dtype=dt)
        dW, db = grad[: n_in * n_out].reshape(n_in, n_out), grad[n_in * n_out :]
        g = np.array(grad_a, dtype=dt, order="C")  # a copy: the kernel overwrites it with delta
        g_prev = np.empty((g.shape[0], n_in), dtype=dt) if input_grad else _EMPTY[dt]
        self._backend.layer_backward(
            self.W,
            np.ascontiguousarray(a_prev, dtype=dt),
            np.ascontiguousarray(a, dtype=dt),
            g,
            self._act,
            dW,
            db,
            g_prev,
        )
        return (g_prev if input_grad else None), grad


class MLP:
    """Fully connected network ``sizes[0] -> sizes[1] -> ... -> sizes[-1]`` on a flat buffer.

    Parameters
    ----------
    sizes : layer widths, input first, e.g. ``[64, 128, 10]``.
    activation : hidden-layer activation, "relu", "sigmoid" or "tanh".
    loss : "softmax_xent" (labels 0..sizes[-1]-1) or "mse" (labels or (n, sizes[-1]) targets).
    dtype : float32 (default) or float64.
    seed : int or ``np.random.Generator`` for the initial weights (He for relu, LeCun
        N(0, 1/n_in) for sigmoid and tanh; biases start at zero).
    device : "cpu" (default), "cuda", or "auto" (the GPU when numba finds one).
    """

    def __init__(
        self,
        sizes,
        activation: str = "relu",
        loss: str = "softmax_xent",
        *,
        dtype=np.float32,
        seed=0,
        device: str = "cpu",
    ):
        self.sizes = layout.check_sizes(sizes)
        activations.activation_code(activation, "activation", activations.HIDDEN_ACTIVATIONS)
        if loss not in LOSSES:
            raise ValueError(f"loss={loss!r} is not supported; allowed: {', '.join(LOSSES)}")
        self.activation, self.loss = activation, loss
        self.dtype = check_dtype(dtype)
        layout.check_fits(self.sizes, self.dtype.itemsize)
        self.device = resolve_device(device)
        if self.device == "cuda":
            from coursekit.nn import kernels_cuda as backend
        else:
            backend = kernels_cpu
        self._backend = backend
        self._sizes_arr = np.asarray(self.sizes, dtype=np.int64)
        self._act = activations.ACTIVATIONS.index(activation)
        self._params = np.zeros(layout.n_params(self.sizes), dtype=self.dtype)
        n_layers = len(self.sizes) - 1
        self.layers = [
            Layer(s.index, W, b, activation if s.index < n_layers - 1 else "identity", s.slice, backend)
            for s, (W, b) in zip(layout.layer_slices(self.sizes), layout.views(self._params, self.sizes))
        ]
        rng = checks.rng(seed)
        gain = 2.0 if activation == "relu" else 1.0
        for layer in self.layers:
            n_in = layer.W.shape[0]
            layer.W[...] = rng.standard_normal(layer.W.shape) * np.sqrt(gain / n_in)

    # -- the flat buffer -------------------------------------------------------------
    @property
    def params(self) -> np.ndarray:
        """The flat parameter buffer (modify it in place; the layer views follow)."""
        return self._params

    @params.setter
    def params(self, values) -> None:
        """``mlp.params = v`` (and ``mlp.params -= lr * grad``) copy into the buffer in place:
        the layers' views stay valid. ``v`` must have the buffer's shape (or broadcast to it)."""
        if values is self._params:  # ``-=`` already updated the buffer in place
            return
        try:
            self._params[...] = values
        except (ValueError, TypeError) as err:
            raise ValueError(f"params takes {self._params.size} numbers (shape "
                             f"{self._params.shape}) or a scalar; got "
                             f"{getattr(values, 'shape', type(values).__name__)}") from err

    @property
    def n_params(self) -> int:
        return self._params.size

    @property
    def device_name(self) -> str:
        """"cpu" or "cuda:<id>": where this model computes in the calling thread
        (:func:`device_name`); the results of the training chapters report it per rank."""
        return device_name(self.device)

    @property
    def n_classes(self) -> int:
        return self.sizes[-1]

    def copy(self, dtype=None) -> "MLP":
        """An independent MLP with the same parameters (cast to ``dtype`` if given)."""
        twin = MLP(
            self.sizes,
            self.activation,
            self.loss,
            dtype=self.dtype if dtype is None else dtype,
            device=self.device,
        )
        twin.params[...] = self._params
        return twin

    def __reduce__(self):
        """Pickle as the constructor's arguments and the weights, not the kernels' module:
        an MLP can be sent to engines as it is (``cluster.run(f, mlp)``)."""
        return _rebuild, (self.sizes, self.activation, self.loss, self.dtype.str, self.device,
                          self._params)

    def __repr__(self) -> str:
        return (
            f"MLP(sizes={list(self.sizes)}, activation={self.activation!r}, loss={self.loss!r}, "
            f"dtype={self.dtype.name}, device={self.device!r}, n_params={self.n_params})"
        )

    # -- input checks ----------------------------------------------------------------
    def check_inputs(self, X) -> np.ndarray:
        """X as a C-contiguous (n, sizes[0]) array of this model's dtype; ValueError if unusable.

        Cheap when X already is such an array (no copy, no dtype conversion): then the only
        pass over the data is the finiteness scan, so ``loss_and_grad``'s default (checked)
        path stays close to the unchecked one (``bench/bench_mlp.py`` measures the ratio).
        """
        X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D (n_samples, n_features); got shape {X.shape}")
        if X.shape[1] != self.sizes[0]:
            raise ValueError(
                f"X has {X.shape[1]} features (columns) but this MLP's input width sizes[0] "
                f"is {self.sizes[0]}"
            )
        if X.shape[0] == 0:
            raise ValueError("X has no rows; pass at least one sample")
        if X.dtype != self.dtype or not X.flags.c_contiguous:
            if X.dtype.kind not in "iuf":  # signed, unsigned, float: not bool, complex, object, dates
                raise TypeError(f"X must hold real numbers; got dtype {X.dtype}")
            with np.errstate(over="ignore"):  # a float64 too large for float32 becomes inf ...
                X = np.ascontiguousarray(X, dtype=self.dtype)
        # ... and is caught here, with the clear error
        if not kernels_cpu.all_finite(X):
            raise ValueError("X contains NaN or infinite values; clean or impute the data first")
        return X

    def check_targets(self, y, n: int) -> np.ndarray:
        """Labels (int64, in [0, n_classes)) or, for "mse", (n, n_classes) float targets."""
        y = np.asarray(y)
        if y.ndim == 2 and self.loss == "mse":
            if y.shape != (n, self.n_classes):
                raise ValueError(
                    f"y (targets) has shape {y.shape}; expected ({n}, {self.n_classes}) for mse"
                )
            y = np.ascontiguousarray(y, dtype=self.dtype)
            if not kernels_cpu.all_finite(y):
                raise ValueError("y (targets) contains NaN or infinite values")
            return y
        if y.ndim != 1 or len(y) != n:
            raise ValueError(f"y must be 1-D with one label per row of X ({n}); got shape {y.shape}")
        if y.dtype.kind not in "iu":  # signed or unsigned integers (not bool, not timedelta)
            raise TypeError(f"y must hold integer class labels; got dtype {y.dtype}")
        labels = np.ascontiguousarray(y, dtype=np.int64)  # no copy when y already is one
        # (a uint64 label >= 2**63 becomes negative here, so it is still out of range)
        if not kernels_cpu.labels_in_range(labels, self.sizes[-1]):
            raise ValueError(
                f"y (labels) must lie in [0, {self.n_classes}) (the output width sizes[-1]); "
                f"got values from {y.min()} to {y.max()}"
            )
        y = labels
        if self.loss == "mse":
            return np.eye(self.n_classes, dtype=self.dtype)[y]
        return y

    def check_batch(self, X, y) -> tuple[np.ndarray, np.ndarray]:
        """Both checks at once; the result can go to ``loss_and_grad(..., validate=False)``."""
        X = self.check_inputs(X)
        return X, self.check_targets(y, X.shape[0])

    # -- compute ---------------------------------------------------------------------
    def forward(self, X) -> np.ndarray:
        """The network's output: logits for "softmax_xent", predictions for "mse"."""
        return self._backend.forward(self._params, self._sizes_arr, self._act, self.check_inputs(X))

    def predict(self, X) -> np.ndarray:
        """Class labels: argmax of the output."""
        return np.argmax(self.forward(X), axis=1)

    def accuracy(self, X, y) -> float:
        """Fraction of rows whose predicted class equals the label."""
        X = self.check_inputs(X)
        y = np.asarray(y)
        if y.ndim != 1 or len(y) != len(X):
            raise ValueError(f"y must be 1-D with one label per row of X ({len(X)}); got shape {y.shape}")
        return float(np.mean(self.predict(X) == y))

    def loss_and_grad(self, X, y, *, out=None, validate: bool = True, timer=None):
        """(mean loss, flat gradient dC/dparams) for the mini-batch (X, y).

        ``out``: a flat buffer like ``params`` to write the gradient into (no allocation).
        ``validate=False`` skips the checks: only for arrays that came from
        :meth:`check_batch` (the train loop checks the whole data set once).

        ``timer(part)``: a context manager entered around each part of the call, so a caller
        can time them apart (e.g. :meth:`coursekit.parallel.spans.SpanRecorder.part`):

        * on "cuda": ``"stage"`` (parameters + batch host -> device), ``"compute"``
          (forward + backward on the device, ending with a synchronize, so its time is the
          kernels' and not their launch's), ``"stage"`` (gradient + loss device -> host);
          t = t_stage_in + t_compute + t_stage_out;
        * on "cpu": ``"compute"`` only; there is nothing to stage (t_stage = 0).
        """
        if validate:
            X, y = self.check_batch(X, y)
        if out is None:
            out = np.empty_like(self._params)
        elif validate:
            want = (f"out must be a C-contiguous {self.dtype.name} array of shape "
                    f"{self._params.shape}")
            if not isinstance(out, np.ndarray):
                raise TypeError(f"{want}; got {type(out).__name__}")
            if (out.shape != self._params.shape or out.dtype != self.dtype
                    or not out.flags.c_contiguous):
                raise ValueError(f"{want}; got {'' if out.flags.c_contiguous else 'a strided '}"
                                 f"{out.dtype.name} {out.shape}")
        b = self._backend
        if self.device == "cpu":
            kernel = b.loss_and_grad_xent if self.loss == "softmax_xent" else b.loss_and_grad_mse
            if timer is None:  # the common case: no context manager (it cost ~0.7 us of 34 on bench (a))
                return float(kernel(self._params, out, self._sizes_arr, self._act, X, y)), out
            with timer("compute"):
                loss = kernel(self._params, out, self._sizes_arr, self._act, X, y)
            return float(loss), out
        timer = _untimed if timer is None else timer
        with timer("stage"):
            staged = b.stage_in(self._params, X, y, self._sizes_arr)
        with timer("compute"):
            b.compute(staged, self.loss, self._sizes_arr, self._act)
        with timer("stage"):
            loss = b.stage_out(staged, out)
        return loss, out


def _untimed(part: str):
    """The default ``timer`` of :meth:`MLP.loss_and_grad`: times nothing."""
    return nullcontext()


def _rebuild(sizes, activation, loss, dtype, device, params) -> MLP:
    """The unpickled MLP (see ``MLP.__reduce__``)."""
    mlp = MLP(sizes, activation, loss, dtype=dtype, device=device)
    mlp.params = params
    return mlp
