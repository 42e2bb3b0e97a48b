"""Gradient check: backpropagation against central finite differences, in float64.

For a parameter w_i the central difference

    dC/dw_i ~ (C(w + eps e_i) - C(w - eps e_i)) / (2 eps)

has truncation error O(eps^2) and rounding error ~ 1e-16 |C| / eps; in float64 eps = 1e-5
balances the two, and a correct analytic gradient agrees to about 1e-6 relative or better
(worst for the tiniest gradient entries). We report, per checked parameter,

    rel_i = |analytic_i - numeric_i| / max(|analytic_i|, |numeric_i|, floor)

(``floor`` keeps gradients that are both ~0 from dividing by ~0) and its maximum.
A bug in backprop gives rel of order 1; a kink of relu hit by w +- eps gives an isolated
large value, which is why the inputs should be random and the check repeated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks

__all__ = ["GradcheckResult", "gradcheck"]


@dataclass(frozen=True)
class GradcheckResult:
    indices: np.ndarray  # which entries of the flat buffer were checked
    analytic: np.ndarray
    numeric: np.ndarray
    rel_error: np.ndarray
    tol: float

    @property
    def max_rel_error(self) -> float:
        return float(self.rel_error.max())

    @property
    def passed(self) -> bool:
        return self.max_rel_error <= self.tol

    def __str__(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return (
            f"gradcheck {verdict}: max relative error {self.max_rel_error:.1e} over "
            f"{len(self.indices)} parameters (tolerance {self.tol:.0e})"
        )


def gradcheck(
    mlp,
    X,
    y,
    *,
    eps: float = 1e-5,
    n_checks: int | None = 200,
    floor: float = 1e-6,
    tol: float = 1e-4,
    seed=0,
) -> GradcheckResult:
    """Compare ``mlp``'s backprop gradient with central differences on a float64 copy.

    ``n_checks`` parameters are drawn at random (``seed``); ``None`` checks all of them.
    ``mlp`` itself is not modified.
    """
    checks.real(eps, "eps", above=0)
    if n_checks is not None:
        checks.integer(n_checks, "n_checks", at_least=1, hint=" or None (all parameters)")
    rng = checks.rng(seed)
    model = mlp.copy(dtype=np.float64)
    X, y = model.check_batch(X, y)
    _, analytic_all = model.loss_and_grad(X, y, validate=False)
    if n_checks is None or n_checks >= model.n_params:
        indices = np.arange(model.n_params)
    else:
        indices = np.sort(rng.choice(model.n_params, n_checks, replace=False))
    w = model.params
    numeric = np.empty(len(indices))
    for k, i in enumerate(indices):
        saved = w[i]
        w[i] = saved + eps
        plus, _ = model.loss_and_grad(X, y, validate=False)
        w[i] = saved - eps
        minus, _ = model.loss_and_grad(X, y, validate=False)
        w[i] = saved
        numeric[k] = (plus - minus) / (2 * eps)
    analytic = analytic_all[indices]
    rel = np.abs(analytic - numeric) / np.maximum(np.maximum(np.abs(analytic), np.abs(numeric)), floor)
    return GradcheckResult(indices, analytic, numeric, rel, tol)
