"""Chapter 1: a multilayer perceptron on one flat parameter buffer, trained by backprop.

* :class:`MLP` - the model; ``mlp.params`` is the flat buffer, ``mlp.layers[i].W/.b`` views.
* :mod:`~coursekit.nn.reference` - the same equations in plain NumPy (read this first).
* :mod:`~coursekit.nn.kernels_cpu` / :mod:`~coursekit.nn.kernels_cuda` - Numba kernels.
* :class:`SGD`, :class:`Momentum`, :class:`LARS`, :func:`train` - optimization on the flat buffer.
* :func:`gradcheck` - backprop against central finite differences.
* :mod:`~coursekit.nn.flops` - FLOP counts, the lecture's CNN table, minimum training time.
* foundations: :mod:`~coursekit.nn.chain_rule` (backprop derived, each step checked),
  :mod:`~coursekit.nn.descent` (dL ~ -r ||g||^2), :mod:`~coursekit.nn.batch_size` (GD, SGD,
  mini-batch), :mod:`~coursekit.nn.model_selection` (train / validation / test),
  :mod:`~coursekit.nn.layer_work` (the lecture's per-layer work table).
"""

from coursekit.nn.gradcheck import GradcheckResult, gradcheck
from coursekit.nn.lars import LARS
from coursekit.nn.mlp import MLP, Layer
from coursekit.nn.optim import SGD, Momentum
from coursekit.nn.train import History, train

__all__ = [
    "LARS", "MLP", "GradcheckResult", "History", "Layer", "Momentum", "SGD", "gradcheck", "train",
]
