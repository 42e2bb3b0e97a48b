"""Bad input to every chapter's public API gets a clear error, fast (DESIGN.md 7; issue 17).

Every case calls one public entry point (what the notebooks, the README and the packages'
``__all__`` offer students) with ONE bad value and checks that:

* a TypeError (wrong type) or ValueError (wrong value) is raised, or the package's own
  subclass of them (``ScheduleError``, ``Deadlock``);
* within ``BOUND_S`` seconds of wall time: no hang, no huge allocation first;
* its message names the parameter and says what is allowed (``names`` and ``allowed``);
* it comes from a ``raise`` statement in coursekit's own code (the argument check), not
  from deep inside NumPy or from an operator applied to the bad value.

The hypothesis tests at the end throw whole families of bad numbers (negative, zero,
NaN, inf, huge, floats for ints, bools, strings) at the numeric settings.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import coursekit
from coursekit import collectives as C, costmodel
from coursekit.collectives.timing import TimingConfig, compare_algorithms, measure_and_predict
from coursekit.comm import run_local
from coursekit.data import load_digits, make_classification, make_regression, minibatches, shard
from coursekit.nn import LARS, MLP, SGD, Momentum, gradcheck, train
from coursekit.nn.flops import mlp_step_flops
from coursekit.parallel import compression as Z
from coursekit.parallel.param_server import PSConfig, PSTopology
from coursekit.parallel.param_server import train as train_param_server
from coursekit.parallel.data_parallel.buckets import make_buckets
from coursekit.parallel.compression.experiment import CompressionConfig
from coursekit.parallel.compression.experiment import train as train_compressed
from coursekit.parallel.data_parallel import DPConfig
from coursekit.parallel.data_parallel import train as train_dp
from coursekit.parallel.data_parallel.strategies import predict_comm
from coursekit.parallel.data_parallel.lr_rules import LRSchedule, scaled_lr
from coursekit.parallel.pipeline import (F, I, Action, Schedule, run_pipeline, schedule, simulate,
                                         stage_layers, validate)
from coursekit.parallel.tensor_parallel import TensorParallelMLP
from coursekit import datafile, sim
from coursekit.cluster import contention
from coursekit.comm import engine_trace, reset_comm, setup_comm, teardown_comm
from coursekit.comm.group import first_ranks, subcomm
from coursekit.nn.warmup import warm_up
from coursekit.parallel import checkpoint
from coursekit.cluster.preflight import run_preflight
from coursekit.roundtrip import measure_round_trips
from coursekit.sim import resnet50
from coursekit.cluster.runner import ClusterRunner, LocalRunner
from coursekit.cluster.scratch import scratch_dir
from coursekit import measure
from coursekit.comm.procs import run_procs
from coursekit.memory import measure_mlp
from coursekit.nn import mixed_precision_demos, speed
from coursekit.nn.experiment import train_digits
from coursekit.sim.validate import measure_and_simulate
from coursekit.collectives.timing import time_algorithms, time_collective
from coursekit.parallel.zero import train_zero

PACKAGE = Path(coursekit.__file__).resolve().parent
BOUND_S = 2.0
"""Seconds a bad call may take to fail (the slowest checks run on ThreadComm ranks)."""

NAN, INF = float("nan"), float("inf")
SEED = "int seed >= 0|integer >= 0|: must be >= 0"
"""What a message about a seed must say is allowed."""
THREADS = LocalRunner(4)
LINK = costmodel.LinkFit(1e-5, 1e-9)
X4 = np.ones((6, 4), np.float32)
Y4 = np.arange(6) % 2


def assert_clear(call, names: str, allowed: str) -> BaseException:
    """``call()`` must fail as the module docstring says; returns the exception."""
    start = time.monotonic()
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert elapsed < BOUND_S, f"took {elapsed:.1f} s to fail: {message}"
    assert names in message, f"message does not name {names!r}: {message}"
    assert re.search(allowed, message), f"message does not say {allowed!r} is allowed: {message}"
    origin = info.traceback[-1]
    assert PACKAGE in Path(origin.path).resolve().parents, \
        f"raised outside coursekit, in {origin.path}: {message}"
    assert str(origin.statement).lstrip().startswith("raise"), \
        f"not raised by a check but by `{str(origin.statement).strip()}`: {message}"
    return info.value


def bad(fn, *args, names: str, allowed: str, **kwargs):
    """One case: ``fn(*args, **kwargs)`` must give a clear error naming ``names``."""
    label = ", ".join([*map(_short, args), *(f"{k}={_short(v)}" for k, v in kwargs.items())])
    return pytest.param(lambda: fn(*args, **kwargs), names, allowed,
                        id=f"{getattr(fn, '__qualname__', fn)}({label})")


def _short(value) -> str:
    if isinstance(value, np.ndarray):
        return f"array{value.shape}{value.dtype}"
    text = re.sub(r" at 0x[0-9a-f]+", "", repr(value))  # the same test id in every process
    return text if len(text) <= 50 else type(value).__name__


def on_ranks(p: int, body):
    """A call that runs ``body(comm)`` on p ThreadComm ranks and raises rank 0's error.

    Every rank must fail (no rank may return, or wait for one that failed); a short comm
    timeout turns a hang into a CommTimeout, which is not a clear error. (Where only one
    rank passes the bad value, the others say "rank(s) [r] passed invalid arguments".)
    """
    def failing(comm):
        try:
            body(comm)
        except (TypeError, ValueError) as exc:
            return exc
        return None

    def call():
        errors = run_local(failing, p, timeout=BOUND_S)
        assert all(errors), f"only some ranks failed: {errors}"
        raise errors[0]
    return call


def mlp(sizes=(4, 3, 2), **kwargs):
    return MLP(list(sizes), **kwargs)


# ---- chapter 1: the MLP, its optimizers, training, data -----------------------------------

CHAPTER_1 = [
    bad(MLP, 5, names="sizes", allowed="sequence of layer widths"),
    bad(MLP, [64], names="sizes", allowed="at least an input and an output"),
    bad(MLP, [], names="sizes", allowed="at least an input and an output"),
    bad(MLP, [64, 0], names="sizes[1]", allowed=">= 1"),
    bad(MLP, [64, -3, 10], names="sizes[1]", allowed=">= 1"),
    bad(MLP, [64, 2.5], names="sizes[1]", allowed="integers"),
    bad(MLP, [64, True], names="sizes[1]", allowed="integers"),
    bad(MLP, [64, NAN], names="sizes[1]", allowed="integers"),
    bad(MLP, ["64", 10], names="sizes[0]", allowed="integers"),
    bad(MLP, [64, 10], activation="softmax", names="activation", allowed="relu"),
    bad(MLP, [64, 10], activation=None, names="activation", allowed="relu"),
    bad(MLP, [64, 10], loss="xent", names="loss", allowed="softmax_xent, mse"),
    bad(MLP, [64, 10], loss=3, names="loss", allowed="softmax_xent, mse"),
    bad(MLP, [64, 10], dtype="float16", names="dtype", allowed="float32, float64"),
    bad(MLP, [64, 10], dtype="int32", names="dtype", allowed="float32, float64"),
    bad(MLP, [64, 10], dtype="bogus", names="dtype", allowed="float32, float64"),
    bad(MLP, [64, 10], device="gpu", names="device", allowed="cpu, cuda, auto"),
    bad(MLP, [64, 10], seed="x", names="seed", allowed=SEED),
    bad(MLP, [64, 10], seed=-1, names="seed", allowed=SEED),
    bad(MLP, [64, 10], seed=1.5, names="seed", allowed=SEED),
    bad(lambda X: mlp().forward(X), np.ones(4, np.float32), names="X", allowed="2-D"),
    bad(lambda X: mlp().forward(X), np.ones((2, 5)), names="X", allowed="sizes\\[0\\] is 4"),
    bad(lambda X: mlp().forward(X), np.ones((0, 4)), names="X", allowed="at least one"),
    bad(lambda X: mlp().forward(X), np.full((2, 4), NAN), names="X", allowed="NaN"),
    bad(lambda X: mlp().forward(X), np.full((2, 4), "a"), names="X", allowed="real numbers"),
    bad(lambda X: mlp().forward(X), np.ones((2, 4), bool), names="X", allowed="real numbers"),
    bad(lambda X: mlp().forward(X), "abc", names="X", allowed="2-D"),
    bad(lambda y: mlp().loss_and_grad(X4, y), Y4 + 0.5, names="y", allowed="integer"),
    bad(lambda y: mlp().loss_and_grad(X4, y), Y4 + 2, names="y", allowed=r"\[0, 2\)"),
    bad(lambda y: mlp().loss_and_grad(X4, y), -Y4 - 1, names="y", allowed=r"\[0, 2\)"),
    bad(lambda y: mlp().loss_and_grad(X4, y), Y4[:3], names="y", allowed="one label per row"),
    bad(lambda y: mlp().loss_and_grad(X4, y), "ab", names="y", allowed="one label per row"),
    bad(lambda y: mlp(loss="mse").loss_and_grad(X4, y), np.ones((6, 3)), names="y",
        allowed=r"\(6, 2\)"),
    bad(lambda out: mlp().loss_and_grad(X4, Y4, out=out), np.ones(3, np.float32), names="out",
        allowed="C-contiguous float32 array of shape"),
    bad(lambda out: mlp().loss_and_grad(X4, Y4, out=out), [0.0] * 23, names="out",
        allowed="C-contiguous float32 array of shape"),
    bad(lambda y: mlp().accuracy(X4, y), Y4[:2], names="y", allowed="one label per row"),
    bad(lambda v: setattr(mlp(), "params", v), np.ones(5), names="params",
        allowed="takes 23 numbers"),
    bad(SGD, [0.0, 1.0], names="params", allowed="flat, contiguous 1-D"),
    bad(SGD, np.ones(3, np.int64), names="params", allowed="float32 or float64"),
    bad(SGD, np.ones(3), lr=0, names="lr", allowed="> 0"),
    bad(SGD, np.ones(3), lr=-0.1, names="lr", allowed="> 0"),
    bad(SGD, np.ones(3), lr=NAN, names="lr", allowed="finite"),
    bad(SGD, np.ones(3), lr=INF, names="lr", allowed="finite"),
    bad(SGD, np.ones(3), lr="0.1", names="lr", allowed="real number"),
    bad(SGD, np.ones(3), lr=True, names="lr", allowed="real number"),
    bad(lambda g: SGD(np.ones(3)).step(g), np.ones(4), names="grad", allowed="match params"),
    bad(lambda g: SGD(np.ones(3)).step(g), np.ones(3, np.float32), names="grad",
        allowed="match params"),
    bad(lambda g: SGD(np.ones(3)).step(g), [1.0, 2.0, 3.0], names="grad",
        allowed="matching params"),
    bad(Momentum, np.ones(3), momentum=1.0, names="momentum", allowed=r"\[0, 1\)"),
    bad(Momentum, np.ones(3), momentum=-0.5, names="momentum", allowed=r"\[0, 1\)"),
    bad(Momentum, np.ones(3), momentum=NAN, names="momentum", allowed=r"\[0, 1\)"),
    bad(LARS, np.ones(3), trust=0, names="trust", allowed="> 0"),
    bad(LARS, np.ones(3), weight_decay=-1, names="weight_decay", allowed=">= 0"),
    bad(LARS, np.ones(3), segments=[(0, 2, True)], names="segments", allowed="tile the 3"),
    bad(LARS, np.ones(3), segments=[(0, 3)], names="segments", allowed="triples"),
    bad(train, mlp(), X4, Y4, epochs=0, names="epochs", allowed=">= 1"),
    bad(train, mlp(), X4, Y4, epochs=-2, names="epochs", allowed=">= 1"),
    bad(train, mlp(), X4, Y4, epochs=1.5, names="epochs", allowed="integer"),
    bad(train, mlp(), X4, Y4, epochs=True, names="epochs", allowed="integer"),
    bad(train, mlp(), X4, Y4, epochs=None, names="epochs", allowed="integer"),
    bad(train, mlp(), X4, Y4, batch_size=0, names="batch_size", allowed=">= 1"),
    bad(train, mlp(), X4, Y4, batch_size=2.0, names="batch_size", allowed="integer"),
    bad(train, mlp(), X4, Y4, lr=0.0, names="lr", allowed="> 0"),
    bad(train, mlp(), X4, Y4, lr=NAN, names="lr", allowed="finite"),
    bad(train, mlp(), X4, Y4, momentum=1.5, names="momentum", allowed=r"\[0, 1\)"),
    bad(train, mlp(), X4, Y4, seed="x", names="seed", allowed=SEED),
    bad(train, mlp(), X4, Y4, X_test=X4, names="X_test", allowed="both"),
    bad(train, mlp(), X4, Y4, callback=5, names="callback", allowed="function"),
    bad(train, mlp(), X4, Y4, optimizer="sgd", names="optimizer", allowed="step"),
    bad(train, "mlp", X4, Y4, names="model", allowed="MLP"),
    bad(gradcheck, mlp(), X4, Y4, eps=0, names="eps", allowed="> 0"),
    bad(gradcheck, mlp(), X4, Y4, n_checks=0, names="n_checks", allowed=">= 1 or None"),
    bad(gradcheck, mlp(), X4, Y4, n_checks=2.5, names="n_checks", allowed=">= 1 or None"),
    bad(mlp_step_flops, [4, 2], 0, names="batch", allowed=">= 1"),
    bad(load_digits, test_fraction=0, names="test_fraction", allowed=r"in \(0, 1\)"),
    bad(load_digits, test_fraction=NAN, names="test_fraction", allowed=r"in \(0, 1\)"),
    bad(load_digits, test_fraction="0.2", names="test_fraction", allowed=r"in \(0, 1\)"),
    bad(load_digits, seed=-1, names="seed", allowed=SEED),
    bad(make_classification, n_samples=1, names="n_samples", allowed=">= 2"),
    bad(make_classification, n_features=0, names="n_features", allowed=">= 1"),
    bad(make_classification, n_classes=1.0, names="n_classes", allowed="integer"),
    bad(make_regression, n_outputs=-1, names="n_outputs", allowed=">= 1"),
    bad(shard, X4, Y4, -1, 2, names="rank", allowed=r"\[0, 2\)"),
    bad(shard, X4, Y4, 2, 2, names="rank", allowed=r"\[0, 2\)"),
    bad(shard, X4, Y4, 0.0, 2, names="rank", allowed="integer"),
    bad(shard, X4, Y4, 0, 0, names="size", allowed=">= 1"),
    bad(shard, X4, Y4, 0, 7, names="size", allowed="exceeds the number of rows"),
    bad(shard, X4, Y4[:3], 0, 2, names="X and y", allowed="same number of rows"),
    bad(shard, 5, Y4, 0, 2, names="X", allowed="array"),
    bad(lambda b: next(minibatches(X4, Y4, b)), 0, names="batch_size", allowed=">= 1"),
]


@pytest.mark.parametrize("call, names, allowed", CHAPTER_1)
def test_chapter_1(call, names, allowed):
    assert_clear(call, names, allowed)


# ---- chapter 2: collectives on ThreadComm ranks, the cost model -----------------------------

def collective(name, x=lambda rank: np.ones(4, np.float32), **kwargs):
    """Every rank calls collective ``name`` with ``x(rank)`` and ``kwargs``."""
    def body(comm):
        return C.FUNCTIONS[name](comm, x(comm.rank), **kwargs) if name in C.FUNCTIONS \
            else C.hierarchical_allreduce(comm, x(comm.rank), **kwargs)
    return body


def bad_collective(name, p=3, *, names, allowed, **kwargs):
    label = ", ".join(f"{k}={_short(v)}" for k, v in kwargs.items())
    return pytest.param(on_ranks(p, collective(name, **kwargs)), names, allowed,
                        id=f"{name}[p={p}]({label})")


ALGORITHM_NAMES = {name: ", ".join(map(repr, algos)) for name, algos in C.ALGORITHMS.items()}
ROOTED = ("bcast", "scatter", "gather", "reduce")
REDUCING = ("reduce", "allreduce", "reduce_scatter")

CHAPTER_2 = [
    *[bad_collective(name, algorithm=algorithm, names="algorithm",
                     allowed=re.escape(ALGORITHM_NAMES[name]))
      for name in C.FUNCTIONS for algorithm in ("bogus", None, "RING")],
    *[bad_collective(name, op=op, names="op", allowed=re.escape("['max', 'min', 'prod', 'sum']"))
      for name in REDUCING for op in ("mean", "SUM", None, np.add)],
    *[bad_collective(name, root=root, names="root", allowed=allowed)
      for name in ROOTED for root, allowed in ((-1, "0..2"), (3, "0..2"), (1.0, "int rank"),
                                               (True, "int rank"), ("0", "int rank"),
                                               (None, "int rank"))],
    *[bad_collective(name, x=x, names="dtype", allowed="allowed: bool, int8")
      for name in C.FUNCTIONS
      for x in (lambda r: "abc", lambda r: None, lambda r: np.array([{}, {}]),
                lambda r: np.ones(3, "M8[s]"))],
    *[bad_collective(name, x=lambda r: np.ones(3 + (r == 1), np.float32),
                     names="same dtype and shape", allowed=re.escape("rank 1: float32(4,)"))
      for name in C.FUNCTIONS if name not in ("bcast", "scatter")],
    *[bad_collective(name, x=lambda r: np.ones(3, np.float32 if r else np.float64),
                     names="same dtype and shape", allowed=re.escape("rank 0: float64(3,)"))
      for name in C.FUNCTIONS if name not in ("bcast", "scatter")],
    bad_collective("bcast", x=lambda r: np.ones(3 + r), names="root's dtype and shape",
                   allowed=re.escape("float64(3,)")),
    *[bad_collective(name, x=lambda r: np.float32(1.0), names="dimension",
                     allowed="at least 1")
      for name in ("scatter", "gather", "alltoall")],
    bad_collective("allreduce", out=[0.0] * 4, names="out", allowed="NumPy array"),
    bad_collective("allreduce", out=np.ones(4, np.float64), names="out", allowed="float32"),
    bad_collective("allreduce", out=np.ones(4, np.float32)[::-1], names="out",
                   allowed="C-contiguous"),
    bad_collective("hierarchical", p=4, ranks_per_node=3, names="ranks_per_node",
                   allowed="divisor"),
    bad_collective("hierarchical", p=4, ranks_per_node=2.0, names="ranks_per_node",
                   allowed="divisor"),
    bad_collective("hierarchical", p=4, names="ranks_per_node", allowed="exactly one"),
    bad_collective("hierarchical", p=4, nodes=["a"], names="nodes", allowed="one per rank"),
    bad_collective("hierarchical", p=4, nodes=5, names="nodes", allowed="one per rank"),
    bad_collective("hierarchical", p=4, ranks_per_node=2, inter="tree", names="inter",
                   allowed="ring"),
    bad_collective("hierarchical", p=4, ranks_per_node=2, op="avg", names="op", allowed="sum"),
    bad(lambda comm: C.allreduce(comm, np.ones(3)), None, names="comm", allowed="Comm"),
    pytest.param(on_ranks(2, lambda comm: C.allreduce(np.ones(3), comm)), "comm", "Comm",
                 id="allreduce(x, comm) swapped"),
    bad(run_local, lambda comm: None, 0, names="ranks", allowed="positive int"),
    bad(run_local, "fn", 2, names="fn", allowed="function"),
    bad(costmodel.predict, "allreduce", "tree", 4, 10, 1e-6, 1e-9, names="algorithm",
        allowed="rabenseifner"),
    bad(costmodel.predict, "allsum", "ring", 4, 10, 1e-6, 1e-9, names="collective",
        allowed="allgather"),
    bad(costmodel.predict, "allreduce", "ring", 0, 10, 1e-6, 1e-9, names="p", allowed=">= 1"),
    bad(costmodel.predict, "allreduce", "ring", 4.0, 10, 1e-6, 1e-9, names="p",
        allowed="integer"),
    bad(costmodel.predict, "allreduce", "ring", True, 10, 1e-6, 1e-9, names="p",
        allowed="integer"),
    bad(costmodel.predict, "allreduce", "ring", 4, -1, 1e-6, 1e-9, names="nbytes",
        allowed=">= 0"),
    bad(costmodel.predict, "allreduce", "ring", 4, NAN, 1e-6, 1e-9, names="nbytes",
        allowed=">= 0"),
    bad(costmodel.predict, "allreduce", "ring", 4, "10", 1e-6, 1e-9, names="nbytes",
        allowed="real numbers"),
    bad(costmodel.predict, "allreduce", "ring", 4, [10, -1], 1e-6, 1e-9, names="nbytes",
        allowed=">= 0"),
    bad(costmodel.predict, "allreduce", "ring", 4, 10, "1e-6", 1e-9, names="alpha",
        allowed="real number"),
    bad(costmodel.predict, "allreduce", "ring", 4, 10, 1e-6, NAN, names="beta", allowed="finite"),
    bad(costmodel.predict, "allreduce", "ring", 4, 10, 1e-6, "fast", names="beta",
        allowed="real number"),
    bad(costmodel.predict, "allreduce", "ring", 4, 10, 1e-6, 1e-9, INF, names="gamma",
        allowed="finite"),
    bad(costmodel.traffic, "allreduce", "ring", 4, 16, itemsize=0, names="itemsize",
        allowed=">= 1"),
    bad(costmodel.traffic, "bcast", "linear", 4, 16, root=4, names="root", allowed="0..3"),
    bad(costmodel.traffic, "bcast", "linear", 4, 16, root=-1, names="root", allowed="0..3"),
    bad(costmodel.traffic, "allreduce", "ring", 4, 10.5, names="nbytes", allowed="integer"),
    bad(costmodel.traffic, "allreduce", "ring", 10**6, 10, names="p", allowed="<= 4096"),
    bad(costmodel.traffic, "allgather", "ring", 4, 10, names="nbytes", allowed="p=4 equal"),
    bad(costmodel.fit, [8, 16], [1.0], names="sizes and times", allowed="same length"),
    bad(costmodel.fit, [8, 8], [1.0, 2.0], names="two different", allowed="sizes"),
    bad(costmodel.fit, [8, 16], [0.0, 1.0], names="times", allowed="> 0"),
    bad(costmodel.fit, [8, 16], [NAN, 1.0], names="times", allowed="> 0"),
    bad(costmodel.fit, ["a", "b"], [1.0, 2.0], names="sizes", allowed="real numbers"),
    bad(costmodel.fit, [8, -16], [1.0, 2.0], names="sizes", allowed=">= 0"),
    bad(costmodel.busbw, "allsum", 4, 10, 1.0, names="collective", allowed="allgather"),
    bad(costmodel.busbw, "allreduce", 0, 10, 1.0, names="p", allowed=">= 1"),
    bad(TimingConfig, "allsum", "ring", [64], names="collective", allowed="'allgather'"),
    bad(TimingConfig, "bcast", "ring", [64], names="bcast algorithm", allowed="'binomial'"),
    bad(TimingConfig, "allreduce", "ring", [64.0], names="sizes", allowed="integer >= 1"),
    bad(TimingConfig, "allreduce", "ring", [64], repeats=0, names="repeats", allowed=">= 1"),
    bad(measure_and_predict, THREADS, TimingConfig("allreduce", "ring", [64]), LINK, workers=5,
        names="workers=5", allowed="has 4 ranks"),
    bad(measure_and_predict, THREADS, TimingConfig("allreduce", "ring", [64]), 1e-9,
        names="link", allowed="LinkFit"),
    bad(compare_algorithms, THREADS, "allreduce", "ring", [64], LINK,
        names="algorithms", allowed="sequence of 'allreduce' algorithm names"),
    bad(compare_algorithms, THREADS, "allreduce", [], [64], LINK,
        names="algorithms", allowed="non-empty"),
    bad(compare_algorithms, THREADS, "allreduce", ["ring", "ring"], [64], LINK,
        names="algorithms", allowed="name each one once"),
    bad(compare_algorithms, THREADS, "allreduce", ["ring", "tree"], [64], LINK,
        names="allreduce algorithm 'tree'", allowed="'recursive_doubling'"),
    bad(compare_algorithms, THREADS, "allreduce", ["ring"], [64], LINK, repeats=0,
        names="repeats", allowed=">= 1"),
    bad(compare_algorithms, THREADS, "allreduce", ["ring"], [64], LINK, workers=5,
        names="workers=5", allowed="has 4 ranks"),
]


@pytest.mark.parametrize("call, names, allowed", CHAPTER_2)
def test_chapter_2(call, names, allowed):
    assert_clear(call, names, allowed)


# ---- chapter 3: synchronous data parallelism ----------------------------------------------

def dp_field(field, value, allowed, **others):
    return bad(DPConfig, **{field: value}, **others, names=field, allowed=allowed)


DATA = (X4, Y4)

CHAPTER_3 = [
    dp_field("sizes", [64], "at least an input"),
    dp_field("sizes", [64, 0], ">= 1"),
    dp_field("dtype", "float16", "float32, float64"),
    dp_field("dtype", "bogus", "float32, float64"),
    dp_field("loss", "hinge", "softmax_xent"),
    dp_field("activation", "gelu", "relu"),
    *[dp_field("batch_size", v, ">= 1|integer") for v in (0, -8, 2.5, True, "64", None)],
    *[dp_field("epochs", v, ">= 1|integer") for v in (0, 1.0, False)],
    dp_field("max_steps", 0, ">= 1"),
    *[dp_field("lr", v, "> 0|number") for v in (0.0, -0.1, NAN, INF, "0.1", True, None)],
    bad(DPConfig, lr_rule="cosine", names="learning-rate rule",
        allowed="constant, linear, sqrt, linear_warmup"),
    dp_field("warmup_steps", -1, ">= 0"),
    dp_field("warmup_steps", 2.5, "integer"),
    *[dp_field("momentum", v, r"\[0, 1\)|>= 0|number") for v in (1.0, -0.1, NAN, "0.9")],
    dp_field("exchange", "gossip", "allreduce, ps, average"),
    dp_field("algorithm", "tree", "ring, reduce_bcast"),
    dp_field("average_every", 0, ">= 1"),
    dp_field("bucket_bytes", 0, ">= 1"),
    dp_field("bucket_bytes", 0.5, "integer"),
    dp_field("bucket_bytes", 1024, "allreduce", exchange="ps"),
    dp_field("slow_factor", 0.5, ">= 1"),
    dp_field("slow_factor", INF, "finite"),
    dp_field("crash_step", 3, "both"),
    dp_field("crash_step", -1, ">= 0", crash_rank=0),
    dp_field("checkpoint_every", 5, "checkpoint_dir"),
    dp_field("eval_every", -1, ">= 0"),
    dp_field("timeline_steps", 1.5, "integer"),
    dp_field("publish_interval", -1.0, ">= 0"),
    dp_field("seed", "x", SEED),
    dp_field("seed", -3, SEED),
    dp_field("overlap", "yes", "True or False"),
    bad(train_dp, THREADS, DPConfig(), DATA, workers=0, names="workers", allowed=">= 1"),
    bad(train_dp, THREADS, DPConfig(), DATA, workers=2.0, names="workers", allowed="integer"),
    bad(train_dp, THREADS, DPConfig(), DATA, workers=5, names="workers=5", allowed="has 4 ranks"),
    bad(train_dp, THREADS, DPConfig(batch_size=2), DATA, workers=3, names="batch_size",
        allowed=">= 3"),
    bad(train_dp, THREADS, DPConfig(straggler_rank=5), DATA, workers=2, names="straggler_rank",
        allowed="0..1"),
    dp_field("straggler_rank", 1.0, "integer >= 0"),
    dp_field("crash_rank", True, "integer >= 0", crash_step=1),
    bad(train_dp, THREADS, DPConfig(), [X4, Y4], workers=2, names="data", allowed=r"\(X, y\) pair"),
    bad(train_dp, THREADS, DPConfig(), (X4, Y4[:3]), workers=2, names="rows",
        allowed="same number"),
    bad(train_dp, THREADS, {"lr": 0.1}, DATA, workers=2, names="config", allowed="DPConfig"),
    bad(LRSchedule, 0.1, "cubic", 4, names="rule", allowed="constant, linear, sqrt"),
    bad(LRSchedule, 0.0, "linear", 4, names="base_lr", allowed="> 0"),
    bad(LRSchedule, NAN, "linear", 4, names="base_lr", allowed="> 0|finite"),
    bad(LRSchedule, 0.1, "linear", 0, names="n", allowed="> 0"),
    bad(LRSchedule, 0.1, "linear", 4, -1, names="warmup_steps", allowed=">= 0"),
    bad(LRSchedule, 0.1, "linear", 4, 2.5, names="warmup_steps", allowed="integer"),
    bad(scaled_lr, 0.1, "linear", 4, step=-1, names="step", allowed=">= 0"),
    bad(make_buckets, 100, 4, 0, names="bucket_bytes", allowed=">= 1"),
    bad(make_buckets, 100, 4, "1", names="bucket_bytes", allowed="integer"),
    bad(make_buckets, 100, 0, 1024, names="itemsize", allowed=">= 1"),
    bad(predict_comm, "gossip", "ring", 4, 100, 1e-6, 1e-9, names="exchange",
        allowed="allreduce, ps, average"),
    bad(predict_comm, "allreduce", "tree", 4, 100, 1e-6, 1e-9, names="algorithm",
        allowed="ring"),
    bad(predict_comm, "allreduce", "ring", 4, 100, 1e-6, 1e-9, bucket_bytes=0,
        names="bucket_bytes", allowed=">= 1"),
    bad(predict_comm, "average", "ring", 4, 100, 1e-6, 1e-9, average_every=0,
        names="average_every", allowed=">= 1"),
]


@pytest.mark.parametrize("call, names, allowed", CHAPTER_3)
def test_chapter_3(call, names, allowed):
    assert_clear(call, names, allowed)


# ---- chapter 4: the parameter server ------------------------------------------------------

def ps_field(field, value, allowed, **others):
    return bad(PSConfig, **{field: value}, **others, names=field, allowed=allowed)


def ps_shape(names, allowed, config=PSConfig(), runner=THREADS, **shape):
    """``train(runner, config, workers=..., servers=...)``: a shape that does not fit."""
    return bad(train_param_server, runner, config, **shape, names=names, allowed=allowed)


CHAPTER_4 = [
    ps_field("model", "hogwild", "'bsp', 'ssp', 'asp'"),
    ps_field("model", None, "'bsp', 'ssp', 'asp'"),
    ps_field("staleness", -1, ">= 0"),
    ps_field("staleness", 1.5, "integer"),
    ps_field("staleness", 2, "ssp", model="asp"),
    *[ps_shape("workers", ">= 1|integer", workers=v) for v in (0, -1, 2.0, True, "3")],
    ps_shape("workers=4", "at most 3 workers", workers=4),
    *[ps_shape("servers", ">= 1|integer", servers=v) for v in (0, 1.5, None)],
    ps_shape("servers=4", "at most 3 server", servers=4),
    ps_shape("servers", "parameters", runner=LocalRunner(10**6 + 1), workers=1, servers=10**6),
    *[ps_field("steps", v, ">= 1|integer") for v in (0, 1e3)],
    ps_field("batch_size", 0, ">= 1"),
    ps_field("n_fetch", 0, ">= 1", model="asp"),
    ps_field("n_push", 2.0, "integer", model="asp"),
    ps_field("n_push", 2, "asp", model="bsp"),
    ps_field("warmup", -1, ">= 0"),
    ps_field("warmup", 101, "exceeds steps"),
    *[ps_field("lr", v, "> 0|number") for v in (0.0, -1.0, NAN, INF, "0.1", None)],
    *[ps_field("momentum", v, r"\[0, 1\)|number") for v in (1.0, -0.5, NAN, "0")],
    ps_field("sizes", (64,), "at least an input"),
    ps_field("dtype", "float16", "float32"),
    ps_field("dtype", "bogus", "float32"),
    ps_field("jitter", -0.1, ">= 0"),
    ps_field("jitter", NAN, ">= 0|finite"),
    ps_field("worker_timeout", 0, "> 0"),
    ps_field("timeout", INF, "finite"),
    ps_shape("straggler", "0..2", PSConfig(straggler={3: 0.1})),
    ps_field("straggler", {0: -1.0}, ">= 0"),
    ps_field("straggler", [0.1], "dict"),
    ps_field("crash", {0: 100}, "0..99"),
    ps_field("crash", {0: 1.5}, "integer"),
    ps_field("crash", {"0": 1}, "integer >= 0"),
    ps_field("crash", {-1: 1}, ">= 0"),
    ps_shape("crash", "0..2", PSConfig(crash={3: 1}), workers=3),
    ps_field("crash_kills", "yes", "True or False"),
    ps_field("checkpoint_every", 5, "checkpoint_dir"),
    ps_field("checkpoint_every", -1, ">= 0"),
    ps_field("eval_every", 0, ">= 1"),
    ps_field("seed", "x", SEED),
    ps_field("resume", "yes", "True or False"),
]


@pytest.mark.parametrize("call, names, allowed", CHAPTER_4)
def test_chapter_4(call, names, allowed):
    assert_clear(call, names, allowed)


# ---- chapter 5: pipeline and tensor parallelism -------------------------------------------

GPIPE = schedule("gpipe", 2, 4)


def tensor_parallel(p, sizes):
    return on_ranks(p, lambda comm: TensorParallelMLP(comm, mlp(sizes)))


CHAPTER_5 = [
    bad(schedule, "pipedream", 2, 4, names="schedule", allowed="gpipe, 1f1b"),
    bad(schedule, None, 2, 4, names="schedule", allowed="gpipe, 1f1b"),
    *[bad(schedule, "gpipe", v, 4, names="stages", allowed=">= 1")
      for v in (0, -2, 2.0, True, "2", None)],
    *[bad(schedule, "1f1b", 2, v, names="microbatches", allowed=">= 1")
      for v in (0, 4.0, NAN)],
    bad(schedule, "1f1b", 4, 2, names="microbatches", allowed=">= stages"),
    bad(schedule, "zb_h1", 4, 3, names="microbatches", allowed=">= stages"),
    bad(schedule, "interleaved_1f1b", 2, 3, chunks=2, names="microbatches",
        allowed="multiple of stages"),
    bad(schedule, "interleaved_1f1b", 2, 4, chunks=0, names="chunks", allowed=">= 1"),
    bad(schedule, "gpipe", 2, 4, chunks=2, names="chunks", allowed="chunks=1"),
    bad(schedule, "gpipe", 4, 10**9, names="microbatches", allowed="at most"),
    bad(schedule, "gpipe", 10**9, 4, names="stages", allowed="at most"),
    *[bad(simulate, GPIPE, **{name: value}, names=name, allowed=">= 0")
      for name in ("t_f", "t_i", "t_w", "p2p") for value in (-1.0, NAN, INF, "1")],
    bad(simulate, GPIPE, t_f=0, t_i=0, names="t_f, t_i and t_w", allowed="duration"),
    bad(validate, Schedule.from_compute("x", [[F(0, 0), Action("b", 0, 0)]], 1), names="'b'",
        allowed=re.escape("B (full backward: input and weight gradient), I (input gradient only)")),
    bad(validate, Schedule.from_compute("x", [[F(0, 0), I(0, 0)]], 1), names="I0.0 has no W0.0",
        allowed="add W0.0 after I0.0, or use B0.0"),
    bad(simulate, "gpipe", names="schedule", allowed="Schedule"),
    bad(validate, [[]], names="schedule", allowed="Schedule"),
    bad(stage_layers, 4, 0, names="n_stages", allowed=">= 1"),
    bad(stage_layers, 4, 3, names="stages", allowed=r"\[1, 2, 4\]"),
    bad(run_pipeline, THREADS, GPIPE, (X4, Y4), mlp=mlp((4, 3, 3, 2)), names="stages",
        allowed=r"\[1, 3\]"),
    bad(run_pipeline, THREADS, GPIPE, (X4[:3], Y4[:3]), mlp=mlp(), names="micro-batches",
        allowed="microbatches <= batch size"),
    bad(run_pipeline, THREADS, GPIPE, (X4, Y4 + 5), mlp=mlp(), names="y", allowed=r"\[0, 2\)"),
    bad(run_pipeline, THREADS, GPIPE, (X4[:, :3], Y4), mlp=mlp(), names="X",
        allowed="sizes\\[0\\] is 4"),
    bad(run_pipeline, THREADS, GPIPE, (X4, Y4), mlp="mlp", names="mlp", allowed="MLP"),
    bad(run_pipeline, THREADS, GPIPE, [X4, Y4], mlp=mlp(), names="data", allowed=r"\(X, y\) pair"),
    bad(run_pipeline, LocalRunner(1), GPIPE, (X4, Y4), mlp=mlp(), names="schedule has 2 ranks",
        allowed="at most 1 rank"),
    pytest.param(tensor_parallel(2, (4, 3, 2)), "n_out", r"\[1, 3\]",
                 id="TensorParallelMLP(3 over 2)"),
    pytest.param(tensor_parallel(3, (4, 6, 4, 2)), "n_out", r"\[1, 2\]",
                 id="TensorParallelMLP(last 2 over 3)"),
    pytest.param(on_ranks(2, lambda comm: TensorParallelMLP(comm, [4, 2, 2])), "mlp", "MLP",
                 id="TensorParallelMLP(mlp=[4, 2, 2])"),
    bad(TensorParallelMLP, None, mlp(), names="comm", allowed="Comm"),
]


@pytest.mark.parametrize("call, names, allowed", CHAPTER_5)
def test_chapter_5(call, names, allowed):
    assert_clear(call, names, allowed)


# ---- chapter 6: compression ---------------------------------------------------------------

GRAD = np.linspace(-1, 1, 12, dtype=np.float32)


def config_field(field, value, allowed, **others):
    return bad(CompressionConfig, **{field: value}, **others, names=field, allowed=allowed)


def exchange_on_ranks(grad, compressor=lambda r: Z.TopK(0.5)):
    return on_ranks(2, lambda comm: Z.exchange(comm, grad(comm.rank), compressor(comm.rank)))


def exchange_of_different_sizes(name, value, sizes=(12, 10)):
    """exchange() moves the payloads unchecked (check=False: the cost model counts no
    fingerprint), so only a rank that cannot fit another's payload can tell: run_local raises
    its error, which is what the notebook sees. ``sizes``: rank 0's and rank 1's gradient;
    the bit-packed compressors' end mark tells even sizes whose payloads have the same bytes."""
    def body(comm):
        grad = np.linspace(-1, 1, sizes[comm.rank], dtype=np.float32)
        Z.exchange(comm, grad, Z.make_compressor(name, value, rng=comm.rank))
    return lambda: run_local(body, 2, timeout=BOUND_S)


CHAPTER_6 = [
    bad(Z.make_compressor, "zip", names="compressor", allowed="none, fp16, uniform"),
    bad(Z.make_compressor, None, names="compressor", allowed="none, fp16, uniform"),
    bad(Z.make_compressor, "fp16", 8, names="fp16", allowed="takes no parameter"),
    *[bad(Z.make_compressor, "topk", v, names="ratio", allowed=r"\(0, 1\]")
      for v in (0, -0.1, 1.5, NAN, INF, "0.1", True)],
    *[bad(Z.make_compressor, "uniform", v, names="bits", allowed=r"\[2, 16\]")
      for v in (1, 17, 4.5, -1, True)],
    *[bad(Z.make_compressor, "qsgd", v, names="levels", allowed=r"\[1, 32767\]")
      for v in (0, 2.0, 10**6)],
    bad(Z.make_compressor, "threshold", -1.0, names="threshold", allowed="> 0"),
    bad(Z.make_compressor, "threshold", NAN, names="threshold", allowed="> 0"),
    bad(Z.make_compressor, "threshold", "0.1", names="threshold", allowed="real number > 0"),
    bad(Z.make_compressor, "powersgd", 2, names="sizes", allowed="layer sizes"),
    bad(Z.make_compressor, "powersgd", 0, sizes=[4, 3, 2], names="rank", allowed=r"\[1, "),
    bad(Z.make_compressor, "powersgd", 4, sizes=[4, 3, 2], names="rank", allowed="4 x 3"),
    bad(Z.make_compressor, "powersgd", 2, sizes=[4, 3, 2], rng=None, names="rng",
        allowed="int seed"),
    bad(Z.make_compressor, "randomk", 0.5, rng="x", names="rng", allowed="Generator or an int"),
    bad(Z.make_compressor, "randomk", 0.5, rng=-1, names="rng", allowed="int seed >= 0"),
    *[bad(lambda g: Z.TopK(0.5).compress(g), g, names="gradient", allowed=allowed)
      for g, allowed in ((GRAD.tolist(), "NumPy array"), (np.arange(4), "float32 or float64"),
                         (np.ones(0, np.float32), "empty"), (np.ones(3, bool), "float32"))],
    bad(lambda p: Z.TopK(0.5).decompress(p), GRAD, names="payload", allowed="Compressed"),
    bad(Z.make_memory, "yes", names="error_feedback", allowed="True or False"),
    pytest.param(exchange_on_ranks(lambda r: GRAD, lambda r: "topk"), "compressor", "collective",
                 id="exchange(compressor='topk')"),
    *[pytest.param(exchange_of_different_sizes(name, value), "same shape", "dtype",
                   id=f"exchange({name}, grads of different sizes)")
      for name, value in (("none", None), ("fp16", None), ("topk", 0.5), ("uniform", 8),
                          ("qsgd", 4), ("sign", None), ("signsgd", None))],
    *[pytest.param(exchange_of_different_sizes(name, value, sizes), "same shape", "dtype",
                   id=f"exchange({name}, {sizes[0]} and {sizes[1]} elements in the same bytes)")
      for name, value, sizes in (("terngrad", None, (11, 9)), ("qsgd", 4, (13, 12)),
                                 ("qsgd", 1, (9, 11)), ("uniform", 3, (18, 16)),
                                 ("signsgd", None, (12, 10)))],
    config_field("compressor", "zip", "none, fp16"),
    bad(CompressionConfig, compressor="topk", value=0.0, names="ratio", allowed=r"\(0, 1\]"),
    bad(CompressionConfig, compressor="none", value=3, names="compressor",
        allowed="takes no parameter"),
    *[config_field("epochs", v, ">= 1|integer") for v in (0, 2.5, True)],
    config_field("batch_size", -4, ">= 1"),
    config_field("hidden", 0, ">= 1"),
    *[config_field("lr", v, "> 0|number|finite") for v in (0.0, -1.0, NAN, INF, "0.1", None)],
    config_field("seed", "x", SEED),
    config_field("error_feedback", "no", "True or False"),
    bad(train_compressed, THREADS, CompressionConfig(), workers=0, names="workers",
        allowed=">= 1"),
    bad(train_compressed, THREADS, CompressionConfig(), workers=2.0, names="workers",
        allowed="integer"),
    bad(train_compressed, THREADS, CompressionConfig(), workers=5, names="workers=5",
        allowed="has 4 ranks"),
    bad(train_compressed, THREADS, {"compressor": "topk"}, names="config",
        allowed="CompressionConfig"),
    bad(train_compressed, 2, CompressionConfig(), names="runner", allowed="LocalRunner"),
]


@pytest.mark.parametrize("call, names, allowed", CHAPTER_6)
def test_chapter_6(call, names, allowed):
    assert_clear(call, names, allowed)


# ---- chapter 7: the simulator -------------------------------------------------------------

NET = sim.Network(2, 2, 1e-6, 1e-9, 1e-5, 1e-8)
NET_ARGS = dict(ranks_per_node=2, nodes=2, alpha_intra=1e-6, beta_intra=1e-9, alpha_inter=1e-5,
                beta_inter=1e-8)
WORK = sim.Workload("w", [1e6, 2e6], [1e-3, 1e-3], 1e-3, 0.0, 8)
WORK_ARGS = dict(name="w", grad_bytes=[1e6], backward_s=[1e-3], forward_s=1e-3, update_s=0.0,
                 batch=8)


def net_field(field, value, allowed):
    return bad(sim.Network, **(NET_ARGS | {field: value}), names=field, allowed=allowed)


def work_field(field, value, names, allowed):
    return bad(sim.Workload, **(WORK_ARGS | {field: value}), names=names, allowed=allowed)


CHAPTER_7 = [
    *[net_field(f, v, ">= 1|positive integer|integer")
      for f in ("ranks_per_node", "nodes", "nics_per_node") for v in (0, -1, 2.5, True, "2")],
    *[net_field(f, v, "> 0|number")
      for f in ("alpha_intra", "beta_intra", "alpha_inter", "beta_inter")
      for v in (0.0, -1e-6, NAN, INF, "1e-6", None)],
    net_field("gamma", -1.0, ">= 0"),
    net_field("nodes", 10**12, "at most"),
    bad(sim.Network.from_bandwidths, 2, 2, intra_latency=1e-6, intra_bandwidth=0,
        inter_latency=1e-5, inter_bandwidth=1e9, names="intra_bandwidth", allowed="> 0"),
    bad(NET.with_nodes, 0, names="nodes", allowed=">= 1|positive"),
    bad(sim.allreduce_time, NET, 10, "butterfly", names="algorithm", allowed="ring"),
    *[bad(sim.allreduce_time, NET, v, names="nbytes", allowed=">= 0|real numbers")
      for v in (-1, NAN, INF, "10", [10, -1], None)],
    bad(sim.allreduce_time, "net", 10, names="net", allowed="Network"),
    work_field("grad_bytes", [], "grad_bytes", "non-empty"),
    work_field("grad_bytes", [[1e6]], "grad_bytes", "1-D"),
    work_field("grad_bytes", [0.0], "grad_bytes", "> 0"),
    work_field("grad_bytes", [NAN], "grad_bytes", "finite"),
    work_field("grad_bytes", ["1e6"], "grad_bytes", "numbers"),
    work_field("backward_s", [-1.0], "backward_s", ">= 0"),
    work_field("backward_s", [1e-3, 1e-3], "backward_s", "same"),
    work_field("forward_s", -1.0, "forward_s", ">= 0"),
    work_field("forward_s", "1", "forward_s", ">= 0|number"),
    work_field("update_s", NAN, "update_s", ">= 0|finite"),
    *[work_field("batch", v, "batch", ">= 1|positive|integer") for v in (0, 1.5, True)],
    bad(WORK.scaled, 0, names="batch", allowed=">= 1|positive"),
    *[bad(sim.Stragglers, **{field: value}, names=field, allowed=allowed)
      for field, value, allowed in (
          ("fraction", 1.5, r"\[0, 1\]"), ("fraction", -0.1, r"\[0, 1\]"),
          ("fraction", NAN, r"\[0, 1\]"), ("fraction", "0.1", r"\[0, 1\]"),
          ("slowdown", 0.5, ">= 1"), ("slowdown", NAN, ">= 1"), ("slowdown", INF, "finite"),
          ("slowdown", "2", ">= 1"), ("jitter", -1.0, ">= 0"), ("jitter", "x", ">= 0|number"),
          ("seed", "x", SEED), ("seed", -1, SEED))],
    bad(sim.simulate_step, WORK, NET, algorithm="star", names="algorithm", allowed="ring"),
    *[bad(sim.simulate_step, WORK, NET, fusion_bytes=v, names="fusion_bytes", allowed=">= 0")
      for v in (-1, NAN, "64")],
    *[bad(sim.simulate_step, WORK, NET, launch_s=v, names="launch_s", allowed=">= 0")
      for v in (-1e-6, INF, "0")],
    bad(sim.simulate_step, WORK, NET, stragglers=0.1, names="stragglers", allowed="Stragglers"),
    bad(sim.simulate_step, "work", NET, names="work", allowed="Workload"),
    bad(sim.simulate_step, WORK, "net", names="net", allowed="Network"),
    bad(sim.buckets, [1.0, 2.0], -1, names="fusion_bytes", allowed=">= 0"),
    bad(sim.scaling, WORK, NET, [1, 0], names="nodes", allowed=">= 1|positive"),
    bad(sim.scaling, WORK, NET, [1, 2.5], names="nodes", allowed=">= 1|positive|integer"),
    bad(sim.scaling, WORK, NET, 4, names="nodes", allowed="list|sequence|iterable"),
    bad(sim.replay, [[sim.Send(0, 1)], [], [], []], NET, names="rank 0", allowed="other ranks"),
    bad(sim.replay, [[sim.Compute(-1.0)], [], [], []], NET, names="compute time",
        allowed=">= 0"),
    bad(sim.replay, [[sim.Compute(NAN)], [], [], []], NET, names="compute time",
        allowed=">= 0"),
    bad(sim.replay, [[sim.Compute("1")], [], [], []], NET, names="compute time",
        allowed=">= 0"),
    bad(sim.replay, [[sim.Send(1, -5)], [], [], []], NET, names="nbytes", allowed=">= 0"),
    bad(sim.replay, [[sim.Send(1.0, 5)], [], [], []], NET, names="rank", allowed="integer"),
    bad(sim.replay, [[]], NET, names="programs", allowed="network of 4"),
    bad(sim.replay, [["send"], [], [], []], NET, names="op", allowed="Compute, Send or Recv"),
    bad(sim.replay, [[sim.Recv(1)], [], [], []], NET, names="rank 0 waits", allowed="Recv"),
    bad(sim.trace_collective, 0, 16, names="ranks", allowed="positive int"),
    bad(sim.trace_collective, 2, 6, names="nbytes", allowed="multiple of 4"),
    bad(sim.trace_collective, 2, 16.0, names="nbytes", allowed="multiple of 4"),
    bad(sim.trace_collective, 2, "16", names="nbytes", allowed="multiple of 4"),
    bad(sim.trace_collective, 2, 16, "star", names="algorithm", allowed="ring"),
    bad(sim.trace_collective, 2, 16, collective="allsum", names="collective",
        allowed="allreduce"),
    bad(sim.replay_schedule, GPIPE, NET, names="pipeline ranks", allowed="must match"),
    bad(sim.replay_schedule, GPIPE, sim.Network(2, 1, 1e-6, 1e-9, 1e-5, 1e-8), t_i=-1.0,
        names="t_i", allowed=">= 0"),
    bad(sim.programs_from_schedule, GPIPE, activation_bytes=-1, names="activation_bytes",
        allowed=">= 0"),
    bad(sim.programs_from_schedule, GPIPE, activation_bytes=1.5, names="activation_bytes",
        allowed="integer"),
    bad(resnet50.workload, batch=0, names="batch", allowed=">= 1|positive"),
    bad(resnet50.workload, images_per_s=0, names="images_per_s", allowed="> 0"),
    bad(resnet50.workload, images_per_s=-5.0, names="images_per_s", allowed="> 0"),
    bad(resnet50.workload, update_s=1.0, names="update_s", allowed="less than"),
    bad(resnet50.case_study_network, 0, names="nodes", allowed=">= 1|positive"),
]


@pytest.mark.parametrize("call, names, allowed", CHAPTER_7)
def test_chapter_7(call, names, allowed):
    assert_clear(call, names, allowed)


# ---- classes of bad input across the API (issue 29): dtypes, rank lists, sizes that cannot ----
# ---- fit in memory, paths, flags, callbacks, data pairs, cluster arguments ----------------

SMALL = (4, 3, 2)
DP_SMALL = DPConfig(sizes=SMALL, batch_size=2, max_steps=1)
TINY = make_classification(n_samples=16, n_features=4, n_classes=2)
HUGE = 10**12
MEMORY = "bytes.*more than this machine's memory"
PATH = r"path \(a str or a pathlib.Path\)"
CLUSTER = r"coursekit cluster \(coursekit.cluster.start"


def nothing(comm):
    return None


def in_group(members):
    return on_ranks(2, lambda comm: subcomm(comm, members))


CLASSES = [
    # dtypes: float32 or float64 only (an int dtype silently truncated the standardized data)
    *[bad(load_digits, dtype=v, names="dtype", allowed="float32, float64")
      for v in (np.int32, "int64", np.float16, None, "bogus")],
    bad(make_classification, 8, 2, 2, dtype=np.int32, names="dtype", allowed="float32, float64"),
    bad(make_regression, 8, 2, dtype="uint8", names="dtype", allowed="float32, float64"),
    bad(warm_up, (np.int32,), announce=None, names="dtypes", allowed="float32, float64"),
    # rank lists: integers, distinct, in range (1.5 was silently rank 1)
    pytest.param(in_group([0, 1.5]), "members[1]", "integers", id="subcomm([0, 1.5])"),
    pytest.param(in_group([0, True]), "members[1]", "integers", id="subcomm([0, True])"),
    pytest.param(in_group(["0", "1"]), "members[0]", "integers", id="subcomm(['0', '1'])"),
    pytest.param(in_group("01"), "members", "list of distinct integer ranks",
                 id="subcomm('01')"),
    pytest.param(in_group(2), "members", "list of distinct integer ranks", id="subcomm(2)"),
    pytest.param(on_ranks(2, lambda comm: first_ranks(comm, 2.0)), "k", "integer",
                 id="first_ranks(2.0)"),
    # sizes that cannot fit in memory: a ValueError with the bytes, not a MemoryError
    bad(make_classification, n_samples=10**9, n_features=10**9, names="n_samples and n_features",
        allowed=MEMORY),
    bad(make_regression, n_samples=10**9, n_features=10**9, names="n_samples and n_features",
        allowed=MEMORY),
    bad(DPConfig, sizes=(4, HUGE, 2), names="sizes", allowed=MEMORY),
    bad(PSConfig, sizes=(4, HUGE, 2), names="sizes", allowed=MEMORY),
    bad(MLP, [4, HUGE, 2], names="sizes", allowed=MEMORY),
    bad(CompressionConfig, hidden=HUGE, names="hidden", allowed=MEMORY),
    # paths: a str or a pathlib.Path (123 failed later, deep inside pathlib)
    *[dp_field("checkpoint_dir", v, PATH) for v in (123, ["ckpt"], b"ckpt")],
    dp_field("checkpoint_dir", "", "non-empty path"),
    ps_field("checkpoint_dir", 123, PATH),
    bad(checkpoint.write, 123, {}, {}, names="path", allowed=PATH),
    bad(checkpoint.read, None, names="path", allowed=PATH),
    bad(checkpoint.RankState.latest, 5, 2, names="directory", allowed=PATH),
    bad(datafile.pack, X4, Y4, 5, names="path", allowed=PATH),
    bad(datafile.PackedFile, None, names="path", allowed=PATH),
    bad(datafile.write_samples, X4, Y4, 7, names="directory", allowed=PATH),
    bad(datafile.SampleFiles, 7, names="directory", allowed=PATH),
    # flags: True or False (np.bool_ too); "no" was taken for True
    bad(train_dp, THREADS, DP_SMALL, DATA, workers=2, resume="no", names="resume",
        allowed="True or False"),
    bad(train_dp, THREADS, DP_SMALL, DATA, workers=2, progress="yes", names="progress",
        allowed="True or False"),
    bad(THREADS.run, nothing, progress=1, names="progress", allowed="True or False"),
    bad(engine_trace, clear="yes", names="clear", allowed="True or False"),
    # callbacks: a function or None ("print" failed at the first update: 'str' is not callable)
    bad(train_dp, THREADS, DP_SMALL, DATA, workers=2, on_update="print", names="on_update",
        allowed="function on_update.* or None"),
    bad(train_param_server, THREADS, PSConfig(), on_update="print", names="on_update",
        allowed="function on_update.* or None"),
    bad(train_param_server, THREADS, PSConfig(), gate="ssp", names="gate",
        allowed="function gate.* or None"),
    bad(train_compressed, THREADS, CompressionConfig(), TINY, workers=2, on_update=5,
        names="on_update", allowed="function on_update.* or None"),
    bad(THREADS.run, nothing, on_update="print", names="on_update",
        allowed="function on_update.* or None"),
    bad(warm_up, announce="print", names="announce", allowed="function announce.* or None"),
    # data pairs: (X, y) arrays, matching rows, the model's width, finite; before the run
    bad(train_dp, THREADS, DP_SMALL, DATA, (X4,), workers=2, names="eval_data",
        allowed=r"\(X, y\) pair"),
    bad(train_dp, THREADS, DP_SMALL, DATA, X4, workers=2, names="eval_data",
        allowed=r"\(X, y\) pair"),
    bad(train_dp, THREADS, DP_SMALL, DATA, (X4[:, :3], Y4), workers=2, names="eval_data",
        allowed=r"4, the model's input width sizes\[0\]"),
    bad(train_dp, THREADS, DP_SMALL, DATA, (X4, Y4[:3]), workers=2, names="eval_data",
        allowed="same number of rows"),
    bad(train_dp, THREADS, DP_SMALL, DATA, (np.full((6, 4), NAN), Y4), workers=2,
        names="eval_data", allowed="finite"),
    bad(train_dp, THREADS, DP_SMALL, (np.ones((6, 5)), Y4), workers=2, names="data",
        allowed=r"4, the model's input width sizes\[0\]"),
    bad(train_dp, THREADS, DP_SMALL, (X4, np.array(list("abcdef"))), workers=2, names="data",
        allowed="numbers"),
    bad(train_param_server, THREADS, PSConfig(), DATA, names="data", allowed="Dataset"),
    bad(train_param_server, THREADS, PSConfig(sizes=(5, 3, 2)), TINY, names="data",
        allowed=r"5, the model's input width"),
    bad(run_pipeline, THREADS, GPIPE, (X4,), mlp=mlp(), names="data", allowed=r"\(X, y\) pair"),
    # cluster arguments: a started coursekit cluster ("not a cluster" gave an AttributeError)
    *[bad(fn, "not a cluster", names="cluster_handle", allowed=CLUSTER)
      for fn in (setup_comm, reset_comm, teardown_comm)],
    bad(ClusterRunner, "not a cluster", names="cluster", allowed=CLUSTER),
    bad(contention.observe, None, names="cluster", allowed=CLUSTER),
    bad(run_preflight, 4, names="cluster", allowed=CLUSTER),
    bad(measure_round_trips, "c", names="cluster", allowed=CLUSTER),
]


# ---- the same classes, swept over the rest of the public API (every package's __all__ and --
# ---- every name the notebooks import): each of these was accepted or failed unclearly -------

STUB_CLUSTER = SimpleNamespace(engine_ids=[0], run=lambda *a: None, size=1)
"""Passes checks.cluster: measure_round_trips checks its other arguments before any engine."""
DIGITS_DATA = "data must be a Dataset"

SWEPT = [
    # dtypes
    bad(speed.measure_matmul_peak, 8, dtype=np.int32, names="dtype",
        allowed="float32, float64"),
    # rank lists and rank counts
    bad(sim.trace_collective, 4, 64, "hierarchical", ranks_per_node=1.5,
        names="ranks_per_node", allowed="integer >= 1"),
    # sizes that cannot fit in memory
    bad(speed.measure_matmul_peak, 10**7, names="n", allowed=MEMORY),
    bad(speed.measure_bandwidth, HUGE * 10, names="nbytes", allowed=MEMORY),
    bad(measure_mlp, [4, 3, 2], micro_batch=HUGE, names="micro_batch", allowed=MEMORY),
    bad(measure_and_simulate, THREADS, 2, sizes=(4, HUGE, 2), names="sizes", allowed=MEMORY),
    bad(sim.trace_collective, 4, HUGE * 1000, names="nbytes", allowed=MEMORY),
    bad(measure.gamma, THREADS, HUGE * 10, ranks=2, names="nbytes", allowed=MEMORY),
    bad(measure.link, THREADS, "pingpong", (8, HUGE * 10), names="sizes", allowed=MEMORY),
    bad(Z.make_compressor, "powersgd", 2, sizes=[4, HUGE, 2], names="sizes", allowed=MEMORY),
    bad(measure_round_trips, STUB_CLUSTER, (8, HUGE * 10), names="nbytes", allowed=MEMORY),
    bad(measure_round_trips, STUB_CLUSTER, (8, 1.5), names="nbytes", allowed="whole numbers"),
    bad(measure_round_trips, STUB_CLUSTER, "abc", names="nbytes", allowed="real numbers"),
    # paths
    bad(checkpoint.Series, 5, "x{key}-{part}", 2, "step", "rank", names="directory",
        allowed=PATH),
    bad(scratch_dir, 123, names="prefix", allowed="str starting with 'coursekit-'"),
    bad(coursekit.cluster.start, 2, profile=123, names="profile",
        allowed=r"IPython profile name \(a non-empty str\) or None"),
    bad(coursekit.cluster.connect, profile=123, names="profile",
        allowed=r"IPython profile name \(a non-empty str\) or None"),
    # flags
    bad(train, mlp(), X4, Y4, progress="no", names="progress", allowed="True or False"),
    bad(speed.training_steps, mlp(), X4, Y4, torch="no", names="torch",
        allowed="True or False"),
    bad(sim.simulate_step, WORK, NET, overlap="no", names="overlap", allowed="True or False"),
    bad(sim.simulate_step, WORK, NET, fp16="no", names="fp16", allowed="True or False"),
    bad(Z.Sign, scaled="no", names="scaled", allowed="True or False"),
    bad(run_procs, nothing, 2, trace="no", names="trace", allowed="True or False"),
    pytest.param(on_ranks(2, lambda comm: C.allreduce(comm, np.ones(3), check="no")), "check",
                 "True or False", id="allreduce(check='no')"),
    pytest.param(on_ranks(2, lambda comm: C.bcast(comm, np.ones(3), check=1)), "check",
                 "True or False", id="bcast(check=1)"),
    # callbacks
    bad(train_digits, epochs=1, callback="print", names="callback",
        allowed=r"function callback\(history\) or None"),
    bad(speed.best_time, "x", names="fn", allowed="function fn()"),
    bad(coursekit.cluster.start, 2, engine_env="x", names="engine_env",
        allowed="dict of environment variables"),
    pytest.param(on_ranks(2, lambda comm: time_collective(comm, "allreduce", "ring", HUGE * 10)),
                 "nbytes", MEMORY, id="time_collective(nbytes=10**13)"),
    pytest.param(on_ranks(2, lambda comm: time_collective(comm, "allreduce", "ring", 1.5)),
                 "nbytes", "integer >= 1", id="time_collective(nbytes=1.5)"),
    pytest.param(on_ranks(2, lambda comm: time_algorithms(comm, "allreduce", "ring", 64)),
                 "algorithms", "wrap one in a tuple", id="time_algorithms(algorithms='ring')"),
    pytest.param(on_ranks(2, lambda comm: time_algorithms(comm, "allreduce", ("ring", "x"), 64)),
                 "allreduce algorithm 'x'", "'recursive_doubling'",
                 id="time_algorithms(algorithms=('ring', 'x'))"),
    # models
    pytest.param(on_ranks(2, lambda comm: train_zero(comm, "mlp", X4, Y4, stage=1, steps=1,
                                                     batch_size=2, lr=0.1)),
                 "mlp", r"MLP \(coursekit.nn.MLP\)", id="train_zero(mlp='mlp')"),
    # data
    bad(train_digits, data=(X4, Y4), names="data", allowed=DIGITS_DATA),
    bad(mixed_precision_demos.compare_formats, data=(X4, Y4), names="data",
        allowed=DIGITS_DATA),
    bad(mixed_precision_demos.overflow, data="digits", names="data", allowed=DIGITS_DATA),
    bad(mixed_precision_demos.underflow, data=[X4, Y4], names="data", allowed=DIGITS_DATA),
]


@pytest.mark.parametrize("call, names, allowed", CLASSES + SWEPT)
def test_classes_of_bad_input(call, names, allowed):
    assert_clear(call, names, allowed)


def test_the_valid_forms_of_each_class_still_pass(tmp_path):
    """numpy ints for ranks, np.bool_ for flags, str and pathlib.Path for paths, a tuple for
    data, None or a function for callbacks, both float dtypes."""
    assert load_digits(dtype=np.float64).X_train.dtype == np.float64
    assert make_classification(8, 2, 2, dtype="float32").X_train.dtype == np.float32
    assert DPConfig(checkpoint_dir=tmp_path).checkpoint_dir == tmp_path
    assert PSConfig(checkpoint_dir=str(tmp_path)).checkpoint_dir == str(tmp_path)
    assert run_local(lambda comm: subcomm(comm, np.array([1, 0])).size, 2) == [2, 2]
    seen = []
    result = train_dp(THREADS, DP_SMALL, DATA, (X4, Y4), workers=2, resume=np.False_,
                      progress=np.bool_(False), on_update=seen.append)
    assert result.loss.shape[-1] == 1 and seen
    assert len(checkpoint.write(tmp_path / "a.ckpt", {"x": X4}, {}).name) > 0
    # the swept entry points
    assert checkpoint.Series(str(tmp_path), "x{key}-{part}", 2, "step", "rank").directory \
        == tmp_path
    assert speed.best_time(lambda: None, repeats=1, min_seconds=0.0) >= 0
    assert sim.simulate_step(WORK, NET, overlap=np.False_, fp16=True).step_s > 0
    assert Z.Sign(scaled=np.bool_(False)).name == "signsgd"
    assert len(sim.trace_collective(4, 64, "hierarchical", ranks_per_node=np.int64(2))) == 4
    assert run_local(lambda comm: C.allreduce(comm, np.ones(3), check=np.False_)[0], 2) == [2, 2]
    history = train(mlp(), X4, Y4, epochs=1, progress=np.False_, callback=seen.append)
    assert seen[-1] is not None and len(history.train_loss) == 1


# ---- families of bad numbers, drawn by hypothesis; one exception type per kind of mistake ---

NOT_NUMBERS = [None, True, False, "1", "0.5", [1], (2,), 1 + 1j, {"n": 1}]
"""Values of the wrong type for any number (a bool is a slip, not 0 or 1)."""


def bad_ints(at_least: int, at_most: int | None = None):
    """Anything but an int in [at_least, at_most]: too small or too large ints, every float
    (NaN, inf, 2.0 ...), bools, strings and other non-numbers."""
    too_large = [st.integers(min_value=at_most + 1)] if at_most is not None else []
    return st.one_of(st.integers(max_value=at_least - 1), *too_large,
                     st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(NOT_NUMBERS))


def bad_reals(low: float, high: float = INF, low_open: bool = False, high_open: bool = False):
    """Anything but a finite real in the interval: floats and ints below or above it (the
    bound itself where it is open), NaN, +-inf, bools, strings and other non-numbers."""
    outside = [st.sampled_from([NAN, INF, -INF, *NOT_NUMBERS])]
    if low > -INF:
        outside += [st.floats(max_value=low, exclude_max=not low_open, allow_nan=False),
                    st.integers(max_value=math.floor(low) if low_open else math.ceil(low) - 1)]
    if high < INF:
        outside += [st.floats(min_value=high, exclude_min=not high_open, allow_nan=False),
                    st.integers(min_value=math.ceil(high) if high_open else math.floor(high) + 1)]
    return st.one_of(*outside)


INT_SETTINGS = [  # (name, call with the value, smallest allowed, largest allowed or None)
    ("epochs", lambda v: train(mlp(), X4, Y4, epochs=v), 1, None),
    ("batch_size", lambda v: train(mlp(), X4, Y4, batch_size=v), 1, None),
    ("batch_size", lambda v: DPConfig(batch_size=v), 1, None),
    ("seed", lambda v: DPConfig(seed=v), 0, None),
    ("bucket_bytes", lambda v: make_buckets(100, 4, v), 1, None),
    ("average_every", lambda v: DPConfig(average_every=v), 1, None),
    ("warmup_steps", lambda v: LRSchedule(0.1, "linear_warmup", 4, v), 0, None),
    ("steps", lambda v: PSConfig(steps=v), 1, None),
    ("staleness", lambda v: PSConfig(staleness=v), 0, None),
    ("workers", lambda v: PSTopology(servers=1, workers=v), 1, None),
    ("servers", lambda v: PSTopology(servers=v, workers=1), 1, None),
    ("epochs", lambda v: CompressionConfig(epochs=v), 1, None),
    ("stages", lambda v: schedule("gpipe", v, 2), 1, 8192),
    ("microbatches", lambda v: schedule("gpipe", 2, v), 1, 8192),
    ("n_samples", lambda v: make_classification(n_samples=v, n_features=2), 2, None),
    ("p", lambda v: costmodel.predict("allreduce", "ring", v, 1e6, 1e-6, 1e-9), 1, None),
    ("p", lambda v: costmodel.traffic("allreduce", "ring", v, 64), 1, 4096),
    ("nodes", lambda v: sim.Network(**(NET_ARGS | {"nodes": v})), 1, 1 << 23),
    ("batch", lambda v: sim.Workload(**(WORK_ARGS | {"batch": v})), 1, None),
    ("bits", lambda v: Z.Uniform(v), 2, 16),
]

REAL_SETTINGS = [  # (name, call with the value, bad_reals' interval)
    ("lr", lambda v: SGD(np.ones(3), lr=v), dict(low=0, low_open=True)),
    ("momentum", lambda v: Momentum(np.ones(3), momentum=v), dict(low=0, high=1, high_open=True)),
    ("lr", lambda v: DPConfig(lr=v), dict(low=0, low_open=True)),
    ("slow_factor", lambda v: DPConfig(slow_factor=v), dict(low=1)),
    ("lr", lambda v: PSConfig(lr=v), dict(low=0, low_open=True)),
    ("jitter", lambda v: PSConfig(jitter=v), dict(low=0)),
    ("lr", lambda v: CompressionConfig(lr=v), dict(low=0, low_open=True)),
    ("base_lr", lambda v: LRSchedule(v, "linear", 4), dict(low=0, low_open=True)),
    ("t_f", lambda v: simulate(GPIPE, t_f=v), dict(low=0)),
    ("ratio", lambda v: Z.TopK(v), dict(low=0, high=1, low_open=True)),
    ("threshold", lambda v: Z.Threshold(v), dict(low=0, low_open=True)),
    ("alpha", lambda v: costmodel.predict("allreduce", "ring", 4, 1e6, v, 1e-9), dict(low=-INF)),
    ("beta_inter", lambda v: sim.Network(**(NET_ARGS | {"beta_inter": v})),
     dict(low=0, low_open=True)),
    ("fraction", lambda v: sim.Stragglers(fraction=v), dict(low=0, high=1)),
    ("slowdown", lambda v: sim.Stragglers(slowdown=v), dict(low=1)),
    ("launch_s", lambda v: sim.simulate_step(WORK, NET, launch_s=v), dict(low=0)),
]


def _ids(settings_list):
    return [f"{name}#{i}" for i, (name, *_) in enumerate(settings_list)]


def _bounds_said(message: str) -> bool:
    """Whether a message states a bound or a kind: what the hypothesis tests accept as
    'says what is allowed' (the tables above check the exact wording)."""
    return bool(re.search(r"[<>]=? -?\d|[\[(]-?\d+(\.\d+)?, |at most|integer|real number|finite",
                          message))


@pytest.mark.parametrize("name, make, at_least, at_most", INT_SETTINGS, ids=_ids(INT_SETTINGS))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_integer_settings_refuse_every_bad_value(name, make, at_least, at_most, data):
    value = data.draw(bad_ints(at_least, at_most), label=name)
    error = assert_clear(lambda: make(value), name, ".")
    assert _bounds_said(str(error)), str(error)


@pytest.mark.parametrize("name, make, interval", REAL_SETTINGS, ids=_ids(REAL_SETTINGS))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_real_settings_refuse_every_bad_value(name, make, interval, data):
    value = data.draw(bad_reals(**interval), label=name)
    error = assert_clear(lambda: make(value), name, ".")
    assert _bounds_said(str(error)), str(error)


@pytest.mark.parametrize("name, make, at_least, at_most", INT_SETTINGS, ids=_ids(INT_SETTINGS))
def test_the_same_mistake_gets_the_same_exception_type_in_every_chapter(name, make, at_least,
                                                                         at_most):
    """A float, a bool or a string where an int belongs is a TypeError; an int out of range
    is a ValueError, whichever chapter's setting it is."""
    for wrong_type in (float(at_least), True, str(at_least), None):
        with pytest.raises(TypeError, match=name):
            make(wrong_type)
    with pytest.raises(ValueError, match=name):
        make(at_least - 1)


@pytest.mark.parametrize("name, make, interval", REAL_SETTINGS, ids=_ids(REAL_SETTINGS))
def test_a_number_of_the_wrong_type_or_nan_gets_the_same_exception_type(name, make, interval):
    for wrong_type in (True, "1", None):
        with pytest.raises(TypeError, match=name):
            make(wrong_type)
    with pytest.raises(ValueError, match=name):
        make(NAN)
