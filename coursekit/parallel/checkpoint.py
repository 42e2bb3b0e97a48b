"""Checkpoints of synchronous training: save every k steps, resume after a crash.

A checkpoint holds everything the next step depends on, so that a resumed run computes
bit for bit what the uninterrupted one would have:

* the parameters (the flat buffer) and the optimizer state (momentum's velocity),
* the step counter (which fixes the learning rate of every later step),
* the data order: the shuffling generator's state and the current epoch's permutation.

Every rank writes its own file ``ckpt-<step>-rank<r>.npz`` (in parameter-server mode
only the server holds the optimizer state; in local SGD every worker has its own), by
writing a temporary file and renaming it, so a crash never leaves half a file. A step is
*complete* when all ``size`` ranks wrote it; :func:`latest_step` returns the newest
complete one, and each rank keeps its previous checkpoint until the next is written.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Checkpoint", "latest_step", "load", "save"]

_NAME = re.compile(r"^ckpt-(\d+)-rank(\d+)\.npz$")


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


def _path(directory: Path, step: int, rank: int) -> Path:
    return directory / f"ckpt-{step:08d}-rank{rank}.npz"


def save(directory, rank: int, ckpt: Checkpoint, keep: int = 2) -> Path:
    """Write ``ckpt`` for ``rank`` atomically; delete this rank's files older than the last ``keep``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = _path(directory, ckpt.step, rank)
    tmp = target.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, params=ckpt.params, velocity=ckpt.velocity, permutation=ckpt.permutation,
                 step=ckpt.step, size=ckpt.size,
                 meta=json.dumps({"rng_state": ckpt.rng_state, "fingerprint": ckpt.fingerprint}))
    os.replace(tmp, target)
    mine = sorted(step for step, r in _listing(directory) if r == rank)
    for step in mine[:-keep]:
        _path(directory, step, rank).unlink(missing_ok=True)
    return target


def _listing(directory: Path) -> list[tuple[int, int]]:
    found = (_NAME.match(p.name) for p in directory.iterdir()) if directory.is_dir() else ()
    return [(int(m[1]), int(m[2])) for m in found if m]


def latest_step(directory, size: int) -> int | None:
    """The newest step for which all ``size`` ranks wrote a checkpoint, or None."""
    listing = _listing(Path(directory))
    complete = [s for s in {step for step, _ in listing}
                if {r for step, r in listing if step == s} >= set(range(size))]
    return max(complete, default=None)


def load(directory, rank: int, size: int, fingerprint: str) -> Checkpoint:
    """This rank's newest complete checkpoint; ValueError if none fits this run."""
    directory = Path(directory)
    step = latest_step(directory, size)
    if step is None:
        written = sorted({r for _, r in _listing(directory)})
        raise ValueError(f"no complete checkpoint for {size} workers in {directory} "
                         f"(files from ranks {written or 'none'}); resume with the same number "
                         "of workers, or start without resume")
    with np.load(_path(directory, step, rank)) as f:
        meta = json.loads(str(f["meta"]))
        ckpt = Checkpoint(int(f["step"]), f["params"], f["velocity"], meta["rng_state"],
                          f["permutation"], int(f["size"]), meta["fingerprint"])
    if ckpt.fingerprint != fingerprint:
        raise ValueError(f"the checkpoint in {directory} was written by a different run "
                         f"({ckpt.fingerprint}); this run is ({fingerprint})")
    return ckpt
