"""The slowest server sets the pace: a BSP iteration's time with slow shards, modelled and measured.

Under BSP every worker needs every shard's weights before it computes, and every shard
needs every worker's gradient before it updates. The shards work in parallel on their own
ranges, so a shard that spends ``d_k`` extra seconds on each update (``server_delay``)
delays the next iteration by ``d_k``, and the iteration waits for the slowest of them:

    T = T_0 + max_k d_k

where ``T_0`` is the iteration time with no delay. Not ``T_0 + sum_k d_k``: that is what
one server holding every range would take (its work is serial).

    >>> bsp_iteration_s(0.004, {0: 0.02, 1: 0.05})
    0.054
"""

from __future__ import annotations

import numpy as np

from coursekit import checks
from coursekit.parallel.param_server.results import PSResult

__all__ = ["bsp_iteration_s", "measured_iteration_s"]


def bsp_iteration_s(base_s: float, server_delay: dict) -> float:
    """``T = T_0 + max_k d_k`` (module docstring): seconds per BSP iteration when shard k
    spends ``server_delay[k]`` extra seconds on each update, ``base_s`` = T_0 without delays."""
    checks.real(base_s, "base_s", at_least=0, hint=" (seconds per iteration without delays)")
    if not isinstance(server_delay, dict):
        raise TypeError(f"server_delay must be a dict {{shard: seconds}}, got {server_delay!r}")
    delays = [checks.real(d, f"server_delay[{k}]", at_least=0) for k, d in server_delay.items()]
    return round(base_s + max(delays, default=0.0), 12)


def measured_iteration_s(result: PSResult) -> float:
    """The median seconds between two consecutive BSP iterations of ``result``: iteration v
    ends when the last shard reaches version v (``max_k update_t``); the median ignores the
    odd step a busy machine stretches."""
    checks.instance(result, "result", PSResult)
    if result.config.model != "bsp":
        raise ValueError(f"measured_iteration_s needs a BSP run (every shard's version v is "
                         f"iteration v), got model={result.config.model!r}")
    ends = np.max([s.update_t for s in result.servers], axis=0)
    if len(ends) < 2:
        raise ValueError("measured_iteration_s needs a run of at least 2 iterations")
    return float(np.median(np.diff(ends)))
