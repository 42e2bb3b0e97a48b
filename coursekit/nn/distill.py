"""Knowledge distillation (Hinton, Vinyals & Dean 2015): a small student learns from a
teacher's soft targets.

With teacher logits z_t, student logits z_s, temperature T and q(z) = softmax(z / T), the
loss of one sample with label y mixes the soft and the hard targets:

    L = alpha * T^2 * KL(q(z_t) || q(z_s)) + (1 - alpha) * CE(softmax(z_s), y)

and its gradient with respect to the student's logits is

    dL/dz_s = alpha * T * (q(z_s) - q(z_t)) + (1 - alpha) * (softmax(z_s) - onehot(y))

(the T^2 keeps the soft term's gradient at the hard term's scale as T grows). Both are
means over the batch. ``alpha = 0`` is ordinary training on the hard labels, so the
student "trained alone" runs through the same loop. The gradient with respect to the
parameters is this dL/dz_s backpropagated through the student's layers
(:meth:`coursekit.nn.mlp.Layer.backward`).

Cost at inference: 2 sum_l n_in n_out FLOPs per sample (:func:`coursekit.nn.flops.dense_macs`),
so a student with a narrow hidden layer is cheaper by the ratio of the MAC counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.data import Dataset, minibatches
from coursekit.nn.flops import dense_macs
from coursekit.nn.layout import check_sizes
from coursekit.nn.mlp import MLP
from coursekit.nn.optim import make_optimizer
from coursekit.nn.train import train as train_mlp

__all__ = ["DistillConfig", "DistillResult", "distill", "distillation_loss",
           "distillation_loss_and_grad", "softmax", "train_student"]


def softmax(z, T: float = 1.0) -> np.ndarray:
    """softmax(z / T) along the last axis (shifted by the row maximum: no overflow)."""
    s = np.asarray(z, dtype=np.float64) / T
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _log_softmax(z, T: float) -> np.ndarray:
    s = np.asarray(z, dtype=np.float64) / T
    s = s - s.max(axis=-1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=-1, keepdims=True))


def distillation_loss(z_student, z_teacher, y, T: float, alpha: float):
    """(L, dL/dz_student) of the module docstring, means over the n rows (float64)."""
    T = checks.real(T, "T", above=0, hint=" (the temperature)")
    alpha = checks.real(alpha, "alpha", at_least=0, at_most=1,
                        hint=" (the weight of the soft targets)")
    zs, zt = np.asarray(z_student, np.float64), np.asarray(z_teacher, np.float64)
    y = np.asarray(y)
    if zs.ndim != 2 or zs.shape != zt.shape or y.shape != (len(zs),):
        raise ValueError(f"z_student and z_teacher must have the same 2-D shape (n, classes) "
                         f"and y one label per row; got {zs.shape}, {zt.shape} and {y.shape}")
    n = len(zs)
    log_qs, log_qt = _log_softmax(zs, T), _log_softmax(zt, T)
    qt = np.exp(log_qt)
    kl = np.sum(qt * (log_qt - log_qs)) / n
    log_p = _log_softmax(zs, 1.0)
    ce = -log_p[np.arange(n), y].sum() / n
    onehot = np.eye(zs.shape[1])[y]
    grad = (alpha * T * (np.exp(log_qs) - qt) + (1 - alpha) * (np.exp(log_p) - onehot)) / n
    return alpha * T * T * kl + (1 - alpha) * ce, grad


def distillation_loss_and_grad(student: MLP, X, y, z_teacher, T: float, alpha: float,
                               out=None):
    """(L, dL/dparams) of ``student`` on (X, y) against the teacher's logits ``z_teacher``:
    a forward pass keeping every layer's activations, dL/dz_s from
    :func:`distillation_loss`, then each layer's backward from the last to the first."""
    acts = [np.ascontiguousarray(X, dtype=student.dtype)]
    for layer in student.layers:
        acts.append(layer.forward(acts[-1]))
    loss, g = distillation_loss(acts[-1], z_teacher, y, T, alpha)
    out = np.empty_like(student.params) if out is None else out
    for layer in reversed(student.layers):
        g, _ = layer.backward(acts[layer.index], acts[layer.index + 1], g,
                              grad=out[layer.span], input_grad=layer.index > 0)
    return loss, out


@dataclass(frozen=True)
class DistillConfig:
    """A teacher, a student and how the student learns from it.

    teacher / student: layer widths (input and output widths equal); T: temperature;
    alpha: weight of the soft targets (0 < alpha <= 1; the student alone uses 0);
    epochs, batch_size, lr: SGD for the teacher and for both students; seed: the initial
    weights and the shuffling (the same for both students)."""

    teacher: tuple = (64, 128, 10)
    student: tuple = (64, 8, 10)
    T: float = 4.0
    alpha: float = 0.9
    epochs: int = 20
    batch_size: int = 32
    lr: float = 0.05
    seed: int = 0

    def __post_init__(self):
        teacher, student = check_sizes(self.teacher), check_sizes(self.student)
        if (teacher[0], teacher[-1]) != (student[0], student[-1]):
            raise ValueError(f"student={student} must have the teacher's input and output "
                             f"widths ({teacher[0]} and {teacher[-1]})")
        object.__setattr__(self, "teacher", tuple(teacher))
        object.__setattr__(self, "student", tuple(student))
        checks.real(self.T, "T", above=0, hint=" (the temperature)")
        checks.real(self.alpha, "alpha", above=0, at_most=1,
                    hint=" (the weight of the soft targets; the student alone has 0)")
        checks.integer(self.epochs, "epochs", at_least=1)
        checks.integer(self.batch_size, "batch_size", at_least=1)
        checks.real(self.lr, "lr", above=0)
        checks.integer(self.seed, "seed", at_least=0)


@dataclass(frozen=True)
class DistillResult:
    """Test accuracies of the teacher, the student alone and the distilled student, and
    the inference FLOPs per sample of the teacher and the student."""

    config: DistillConfig
    teacher: MLP
    alone: MLP
    distilled: MLP
    teacher_accuracy: float
    alone_accuracy: float
    distilled_accuracy: float

    @property
    def teacher_flops(self) -> int:
        """Forward FLOPs per sample: 2 sum_l n_in n_out."""
        return 2 * dense_macs(self.config.teacher)

    @property
    def student_flops(self) -> int:
        return 2 * dense_macs(self.config.student)


def train_student(student: MLP, X, y, z_teacher, *, T: float, alpha: float, epochs: int,
                  batch_size: int, lr: float, seed) -> float:
    """Mini-batch SGD on :func:`distillation_loss_and_grad` (``z_teacher`` holds the
    teacher's logits for every row of X; alpha = 0 ignores them). Returns the seconds."""
    rng = checks.rng(seed)
    opt = make_optimizer(student.params, lr)
    rows = np.arange(len(X))
    grad = np.empty_like(student.params)
    start = time.perf_counter()
    for _ in range(epochs):
        for idx, _ in minibatches(rows, rows, batch_size, rng):
            distillation_loss_and_grad(student, X[idx], y[idx], z_teacher[idx], T, alpha,
                                       out=grad)
            opt.step(grad)
    return time.perf_counter() - start


def distill(config: DistillConfig, data) -> DistillResult:
    """Train the teacher on the hard labels, then the same initial student twice (same
    seed, same batches): alone (alpha = 0) and on the teacher's soft targets; ``data`` is a
    :class:`coursekit.data.Dataset` (its test split gives the accuracies)."""
    checks.instance(config, "config", DistillConfig)
    checks.instance(data, "data", Dataset, " (e.g. coursekit.data.load_digits())")
    X, y = checks.data_pair((data.X_train, data.y_train), "data", features=config.teacher[0])
    teacher = MLP(config.teacher, seed=config.seed)
    train_mlp(teacher, X, y, epochs=config.epochs, batch_size=config.batch_size,
              lr=config.lr, seed=config.seed)
    z_teacher = teacher.forward(X)
    students = {}
    for name, alpha in (("alone", 0.0), ("distilled", config.alpha)):
        student = MLP(config.student, seed=config.seed + 1)
        train_student(student, X, y, z_teacher, T=config.T, alpha=alpha, epochs=config.epochs,
                      batch_size=config.batch_size, lr=config.lr, seed=config.seed)
        students[name] = student
    acc = {k: m.accuracy(data.X_test, data.y_test)
           for k, m in (("teacher", teacher), *students.items())}
    return DistillResult(config, teacher, students["alone"], students["distilled"],
                         acc["teacher"], acc["alone"], acc["distilled"])
