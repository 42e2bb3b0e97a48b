"""Chapter 6: gradient compression, split the GRACE way.

* compressors, one module per family: :mod:`.quantization` (none, fp16, uniform b-bit,
  QSGD, TernGrad), :mod:`.sign` (signSGD with majority vote, scaled sign),
  :mod:`.sparsification` (top-k, random-k, threshold), :mod:`.lowrank` (PowerSGD). Each
  docstring gives the formula, the bytes on the wire and whether it is unbiased.
* :mod:`.memory`: error feedback (the residual is added to the next gradient).
* :mod:`.communicator`: :func:`exchange` (allreduce dense payloads, allgather sparse and
  quantized ones), the bytes on the wire, the cost model's time.
* :mod:`.experiment`: data-parallel training on digits with a compressor, on any Comm.
* :mod:`.inference`: INT8 weights for inference (accuracy and size).

``make_compressor(name, value)`` builds one by name: ``COMPRESSORS[name]`` gives its class
(with its ``collective``), which parameter ``value`` is (ratio, bits, levels, rank,
threshold or none) and its default.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .base import Compressed, Compressor
from .communicator import Exchanged, allgatherv, exchange, predict_seconds, sent_per_rank
from .lowrank import PowerSGD
from .memory import ErrorFeedback, NoMemory, make_memory
from .quantization import FP16, QSGD, LevelQuantizer, NoCompression, TernGrad, Uniform
from .sign import Sign
from .sparsification import RandomK, Threshold, TopK

class Entry(NamedTuple):
    """A registered compressor: its class, the parameter ``make_compressor``'s value sets
    (None: it has none) and its default, fixed keyword arguments, whether it needs a rng."""

    cls: type
    param: str | None
    default: float | int | None
    fixed: dict
    stochastic: bool


COMPRESSORS = {
    "none": Entry(NoCompression, None, None, {}, False),
    "fp16": Entry(FP16, None, None, {}, False),
    "uniform": Entry(Uniform, "bits", 8, {}, False),
    "qsgd": Entry(QSGD, "levels", 4, {}, True),
    "terngrad": Entry(TernGrad, None, None, {}, True),
    "signsgd": Entry(Sign, None, None, {"scaled": False}, False),
    "sign": Entry(Sign, None, None, {}, False),
    "topk": Entry(TopK, "ratio", 0.01, {}, False),
    "randomk": Entry(RandomK, "ratio", 0.01, {}, True),
    "threshold": Entry(Threshold, "threshold", 0.1, {}, False),
    "powersgd": Entry(PowerSGD, "rank", 2, {}, False),
}
"""name -> :class:`Entry`."""


def make_compressor(name: str, value=None, *, rng=0, sizes=None):
    """The compressor ``name`` with its parameter set to ``value`` (None: the default).

    ``rng``: Generator or int seed of stochastic compressors (qsgd, terngrad, randomk; use a
    different one per rank). ``sizes``: MLP layer sizes, needed by "powersgd" (it
    compresses each weight matrix; ``rng`` must then be the same int seed on every rank).
    """
    if name not in COMPRESSORS:
        raise ValueError(f"unknown compressor {name!r}; allowed: {', '.join(COMPRESSORS)}")
    entry = COMPRESSORS[name]
    if entry.param is None and value is not None:
        raise ValueError(f"compressor {name!r} takes no parameter, got {value!r}")
    value = entry.default if value is None else value
    if name == "powersgd":
        if sizes is None:
            raise ValueError("powersgd needs the MLP's layer sizes: make_compressor('powersgd', "
                             "rank, sizes=mlp.sizes)")
        if not isinstance(rng, (int, np.integer)):
            raise TypeError("powersgd's rng must be an int seed, the same on every rank")
        return PowerSGD.for_mlp(sizes, value, seed=int(rng))
    args = () if entry.param is None else (value,)
    return entry.cls(*args, **entry.fixed, **({"rng": rng} if entry.stochastic else {}))


__all__ = ["COMPRESSORS", "Entry", "FP16", "QSGD", "Compressed", "Compressor", "ErrorFeedback",
           "Exchanged", "LevelQuantizer", "NoCompression", "NoMemory", "PowerSGD", "RandomK",
           "Sign", "TernGrad", "Threshold", "TopK", "Uniform", "allgatherv", "exchange",
           "make_compressor", "make_memory", "predict_seconds",
           "sent_per_rank"]
