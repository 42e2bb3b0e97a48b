"""Checkpoint and restore a parameter-server shard.

A shard's state is its weights, the optimizer's velocity (momentum), its version, the number
of mini-batch gradients applied and every worker's clock. Each shard writes its own file
``shard{k}of{S}_v{version}.npz`` through :mod:`.checkpoint_files`: with a SHA-256 checksum
inside, to a temporary file that is fsync'ed and renamed, so a run killed in the middle
never leaves half a checkpoint under that name. :func:`latest_version` finds the newest
version that *every* shard saved and whose files are all intact (it warns about newer ones
it skipped): restoring all shards at that version gives a consistent state, and a restarted
run continues from it without losing any update applied before it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..checkpoint_files import Series


def _series(directory, n_shards: int) -> Series:
    return Series(Path(directory), f"shard{{part}}of{n_shards}_v{{key}}.npz",
                  re.compile(rf"^shard(?P<part>\d+)of{n_shards}_v(?P<key>\d+)\.npz$"),
                  "version", "shard")


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
        still be writing a version this shard has passed, so more than one is kept), and so
        are the temporary files a killed save of this shard left.
        """
        arrays = dict(params=self.params, clocks=self.clocks)
        if self.velocity is not None:
            arrays["velocity"] = self.velocity
        return _series(directory, self.n_shards).save(
            self.version, self.shard, arrays, dict(lo=self.lo, hi=self.hi, applied=self.applied),
            keep)


def latest_version(directory, n_shards: int) -> int:
    """The newest version all ``n_shards`` shards saved intact; ValueError if there is none."""
    version, skipped = _series(directory, n_shards).newest_valid(n_shards)
    if version is None:
        raise ValueError(f"no checkpoint in {directory} has all {n_shards} shards intact"
                         f"{' (unusable: ' + skipped + ')' if skipped else ''}; run with "
                         "checkpoint_every > 0 first (or check n_servers)")
    return version


def load(directory, shard: int, n_shards: int, lo: int, hi: int, version: int,
         n_workers: int) -> ShardState:
    """Shard ``shard``'s state at ``version``; ValueError if it is damaged or does not fit."""
    series = _series(directory, n_shards)
    arrays, meta = series.read(version, shard)
    state = ShardState(shard, n_shards, meta["lo"], meta["hi"], arrays["params"],
                       arrays.get("velocity"), version, meta["applied"], arrays["clocks"])
    name = series.path(version, shard).name
    if (state.lo, state.hi) != (lo, hi):
        raise ValueError(f"{name} holds parameters [{state.lo}, {state.hi}) but this run's "
                         f"shard {shard} holds [{lo}, {hi}): the model or n_servers changed")
    if len(state.clocks) != n_workers:
        raise ValueError(f"{name} has clocks for {len(state.clocks)} workers; this run has "
                         f"{n_workers}: restart with the same n_workers")
    return state
