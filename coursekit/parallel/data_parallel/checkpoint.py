"""Checkpoints of synchronous training: save every k steps, resume after a crash.

A checkpoint holds everything the next step depends on, so that a resumed run computes
bit for bit what the uninterrupted one would have:

* the parameters (the flat buffer) and the optimizer state (momentum's velocity),
* the step counter (which fixes the learning rate of every later step),
* the data order: the shuffling generator's state and the current epoch's permutation.

Every rank writes its own file ``ckpt-<step>-rank<r>.npz`` (in parameter-server mode
only the server holds the optimizer state; in local SGD every worker has its own) through
:mod:`.checkpoint_files`: with a SHA-256 checksum inside, to a temporary file that is
fsync'ed and renamed, so a crash never leaves half a file under that name. A step is
*valid* when all ``size`` ranks wrote it and every file passes its checks; :func:`latest_step`
returns the newest valid one, warning about newer files it skipped (damaged, truncated,
missing), and each rank keeps its previous checkpoint until the next is written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..checkpoint_files import Series

__all__ = ["Checkpoint", "latest_step", "load", "save"]


@dataclass(frozen=True)
class Checkpoint:
    """One rank's state after ``step`` steps (see the module docstring)."""

    step: int
    params: np.ndarray
    velocity: np.ndarray  # empty when the optimizer has no state
    rng_state: dict       # np.random.Generator.bit_generator.state after the epoch's permutation
    permutation: np.ndarray
    size: int             # number of workers that wrote it
    fingerprint: str      # what must not change between the run and its resumption


def _series(directory) -> Series:
    return Series(Path(directory), "ckpt-{key:08d}-rank{part}.npz",
                  re.compile(r"^ckpt-(?P<key>\d+)-rank(?P<part>\d+)\.npz$"), "step", "rank")


def save(directory, rank: int, ckpt: Checkpoint, keep: int = 2) -> Path:
    """Write ``ckpt`` for ``rank`` (checksummed, durable, atomic); delete this rank's files
    older than its last ``keep`` and the temporary files a killed save of it left."""
    return _series(directory).save(
        ckpt.step, rank,
        dict(params=ckpt.params, velocity=ckpt.velocity, permutation=ckpt.permutation),
        dict(size=ckpt.size, rng_state=ckpt.rng_state, fingerprint=ckpt.fingerprint), keep)


def latest_step(directory, size: int) -> int | None:
    """The newest step whose files from all ``size`` ranks exist and are intact, or None."""
    return _series(directory).newest_valid(size)[0]


def load(directory, rank: int, size: int, fingerprint: str) -> Checkpoint:
    """This rank's state at :func:`latest_step`; ValueError if none is valid or fits this run."""
    series = _series(directory)
    step, skipped = series.newest_valid(size)
    if step is None:
        written = sorted({r for files in series.listing().values() for r in files})
        raise ValueError(f"no complete checkpoint for {size} workers in {directory} "
                         f"(files from ranks {written or 'none'}"
                         f"{'; unusable: ' + skipped if skipped else ''}); resume with the same "
                         "number of workers, or start without resume")
    arrays, meta = series.read(step, rank)
    ckpt = Checkpoint(step, arrays["params"], arrays["velocity"], meta["rng_state"],
                      arrays["permutation"], meta["size"], meta["fingerprint"])
    if ckpt.fingerprint != fingerprint:
        raise ValueError(f"the checkpoint in {directory} was written by a different run "
                         f"({ckpt.fingerprint}); this run is ({fingerprint})")
    return ckpt
