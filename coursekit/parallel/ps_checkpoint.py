"""Checkpoint and restore a parameter-server shard.

A shard's state is its weights, the optimizer's velocity (momentum), its version, the number
of mini-batch gradients applied and every worker's clock. Each shard writes its own file
``shard{k}of{S}_v{version}.npz`` (atomically: a temporary file renamed into place), so a
run killed in the middle never leaves a half-written checkpoint. :func:`latest_version`
finds the newest version that *every* shard saved: restoring all shards at that version
gives a consistent state, and a restarted run continues from it without losing any update
applied before it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_NAME = re.compile(r"shard(\d+)of(\d+)_v(\d+)\.npz$")


@dataclass
class ShardState:
    """Everything a shard needs to carry on: see the module docstring."""

    shard: int
    n_shards: int
    lo: int
    hi: int
    params: np.ndarray
    velocity: np.ndarray | None
    version: int
    applied: int
    clocks: np.ndarray

    def save(self, directory, keep: int = 3) -> Path:
        """Write ``shard{k}of{S}_v{version}.npz`` under ``directory``; return its path.

        This shard's older files beyond the newest ``keep`` are deleted (the others may
        still be writing a version this shard has passed, so more than one is kept).
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"shard{self.shard}of{self.n_shards}_v{self.version}.npz"
        tmp = path.with_suffix(".tmp.npz")
        arrays = dict(params=self.params, version=self.version, applied=self.applied,
                      clocks=self.clocks, lo=self.lo, hi=self.hi)
        if self.velocity is not None:
            arrays["velocity"] = self.velocity
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
        mine = sorted(_saved(directory, self.n_shards).get(self.shard, []))
        for version in mine[:-keep]:
            (directory / f"shard{self.shard}of{self.n_shards}_v{version}.npz").unlink(missing_ok=True)
        return path


def _saved(directory, n_shards: int) -> dict[int, list[int]]:
    """{shard: [versions saved]} of the checkpoints of ``n_shards`` shards in ``directory``."""
    found: dict[int, list[int]] = {}
    for path in Path(directory).glob("shard*of*_v*.npz"):
        m = _NAME.search(path.name)
        if m and int(m[2]) == n_shards:
            found.setdefault(int(m[1]), []).append(int(m[3]))
    return found


def latest_version(directory, n_shards: int) -> int:
    """The newest version saved by all ``n_shards`` shards; ValueError if there is none."""
    saved = _saved(directory, n_shards)
    common = set.intersection(*(set(saved.get(k, ())) for k in range(n_shards)))
    if not common:
        raise ValueError(f"no checkpoint in {directory} has all {n_shards} shards; "
                         "run with checkpoint_every > 0 first (or check n_servers)")
    return max(common)


def load(directory, shard: int, n_shards: int, lo: int, hi: int, version: int,
         n_workers: int) -> ShardState:
    """Shard ``shard``'s state at ``version``; ValueError if it does not fit this run."""
    path = Path(directory) / f"shard{shard}of{n_shards}_v{version}.npz"
    with np.load(path) as f:
        state = ShardState(shard, n_shards, int(f["lo"]), int(f["hi"]), f["params"].copy(),
                           f["velocity"].copy() if "velocity" in f else None,
                           int(f["version"]), int(f["applied"]), f["clocks"].copy())
    if (state.lo, state.hi) != (lo, hi):
        raise ValueError(f"{path.name} holds parameters [{state.lo}, {state.hi}) but this run's "
                         f"shard {shard} holds [{lo}, {hi}): the model or n_servers changed")
    if len(state.clocks) != n_workers:
        raise ValueError(f"{path.name} has clocks for {len(state.clocks)} workers; this run has "
                         f"{n_workers}: restart with the same n_workers")
    return state
