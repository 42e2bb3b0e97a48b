"""Checks for exercise 00: fit the message-cost model t = l + n / bw."""

from __future__ import annotations

import numpy as np

from coursekit.grading.core import CheckFailure, check

#: (latency in s, bandwidth in bytes/s, relative noise) of the synthetic cases
CASES = ((50e-6, 1.5e9, 0.0), (3.5e-3, 4e8, 0.0), (1.5e-6, 6.3e9, 0.02), (65e-6, 1.5e9, 0.05))


def synthetic_times(sizes: np.ndarray, latency: float, bandwidth: float, noise: float,
                    rng: np.random.Generator) -> np.ndarray:
    """t = l + n / bw, with multiplicative noise of relative size ``noise``."""
    exact = latency + sizes / bandwidth
    return exact * (1 + noise * rng.standard_normal(len(sizes)))


@check("fit_latency_bandwidth")
def check_fit_latency_bandwidth(fit, seed: int = 0):
    """``fit(sizes_bytes, times_s) -> (latency_s, bandwidth_bytes_per_s)``."""
    rng = np.random.default_rng(seed)
    sizes = np.geomspace(8, 64 << 20, 12)
    for latency, bandwidth, noise in CASES:
        times = synthetic_times(sizes, latency, bandwidth, noise, rng)
        result = fit(sizes.copy(), times.copy())
        try:
            got_l, got_bw = (float(v) for v in result)
        except (TypeError, ValueError):
            raise CheckFailure(
                f"fit must return two numbers (latency_s, bandwidth_bytes_per_s), got {result!r}"
            ) from None
        case = f"for t = {latency:g} s + n / {bandwidth:g} B/s (noise {noise:.0%})"
        if not np.isclose(got_bw, bandwidth, rtol=1e-6 if noise == 0 else 0.1):
            raise CheckFailure(f"{case}: expected bandwidth ~{bandwidth:.4g} B/s, got {got_bw:.4g}")
        if not np.isclose(got_l, latency, rtol=1e-6 if noise == 0 else 0.2):
            hint = ("" if noise == 0 else " -- an unweighted fit lets the largest messages' noise "
                    "swamp the latency: fit relative errors (weights 1/t, e.g. np.polyfit(..., w=1/t))")
            raise CheckFailure(f"{case}: expected latency ~{latency:.4g} s, got {got_l:.4g}{hint}")
    return f"{len(CASES)} synthetic cost curves fitted (exact and noisy)"
