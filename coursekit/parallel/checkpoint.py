"""Checkpoints: save every k steps, resume after a crash, from files that prove they are whole.

The library's one checkpoint module: synchronous data-parallel SGD (:mod:`.data_parallel`)
and the parameter server (:mod:`.param_server`) both save and resume through it.

**What is saved.** A checkpoint is a set of files, one per *part* for one *key*:

* :class:`RankState`, a data-parallel rank (part) after ``step`` steps (key), in
  ``ckpt-<step>-rank<r>.npz``: the parameters (the flat buffer), the optimizer state
  (momentum's velocity), the step counter (which fixes the learning rate of every later
  step) and the data order (the shuffling generator's state and the epoch's permutation),
  so that a resumed run computes bit for bit what the uninterrupted one would have. In
  parameter-server mode only the server holds optimizer state; in local SGD every worker has
  its own.
* :class:`ShardState`, a parameter-server shard (part) at ``version`` (key), in
  ``shard<k>of<S>_v<version>.npz``: its weights, velocity, version, the number of
  mini-batch gradients applied and every worker's clock. Restoring all shards at one
  version gives a consistent state, and a restarted run continues from it without losing
  any update applied before it.

Each state is saved by its own part (``state.save(directory)``) and read back by
``RankState.load`` / ``ShardState.load``, which take the newest complete checkpoint and
refuse, with a ValueError naming what differs, one that does not fit this run (another
configuration or number of workers; other shard ranges or worker count).

**Guarantees** (the file mechanics: :func:`write`, :func:`read`, :class:`Series`):

* **Checksum.** :func:`write` stores the arrays and the metadata (as JSON text) in an
  ordinary ``.npz`` whose last 64 bytes, the zip archive's comment, are the SHA-256 (hex)
  of every byte before them. :func:`read` recomputes it before parsing anything, so any
  change anywhere in the file (a truncation, one flipped bit in the data, the metadata, a
  header or the checksum itself, a file edited and re-saved) raises
  :class:`CorruptCheckpoint`, which names the file and the reason. It detects accidents and
  careless edits; it is not a signature (whoever can run this code can forge it).
  :meth:`Series.read` also checks that the file holds the key and part its name says, so a
  file copied or renamed over another is refused. ``np.load`` still opens the files.
* **Durable, atomic write.** The bytes go to ``<name>.tmp``, which is flushed and fsync'ed,
  then renamed over ``<name>`` (``os.replace`` is atomic), then the directory is fsync'ed so
  that the rename itself survives a power cut. A process killed at any moment leaves the
  files it had plus at most one ``.tmp``, which no reader looks at and the part's next
  save deletes. Each part keeps its newest few files (:attr:`RankState.KEEP`,
  :attr:`ShardState.KEEP`) until the next is written.
* **Fallback.** :meth:`Series.newest_valid` returns the newest key whose files exist and
  verify for every part, and warns (:class:`CheckpointFallbackWarning`) naming each newer
  file it skipped and why. Every part checks every part's files, so all of them pick the
  same key without talking to each other; reading ``parts`` files per part is the price.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import string
import warnings
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import numpy as np

from coursekit import checks

__all__ = ["CheckpointFallbackWarning", "CorruptCheckpoint", "RankState", "Series", "ShardState",
           "read", "write"]

TMP = ".tmp"  # suffix of a file being written; renamed away once it is complete
_META = "__meta__"  # the array holding the metadata's JSON text
_DIGEST_LEN = 64  # hex characters of a SHA-256: the zip comment that ends every file


class CorruptCheckpoint(ValueError):
    """A checkpoint file is damaged or not what its name says; ``path`` and ``reason`` say how."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = Path(path), reason


class CheckpointFallbackWarning(UserWarning):
    """Newer checkpoint files were skipped (damaged or missing): an older checkpoint is used."""


def _sha256(f, n: int) -> bytes:
    """Hex SHA-256 of the first ``n`` bytes of the open file ``f``."""
    f.seek(0)
    h = hashlib.sha256()
    while n > 0:
        chunk = f.read(min(n, 1 << 20))
        if not chunk:
            break
        h.update(chunk)
        n -= len(chunk)
    return h.hexdigest().encode()


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX: entries reach the disk with it)."""
    if os.name == "nt":  # Windows cannot open a directory; NTFS journals the rename itself
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(path, arrays: dict, meta: dict) -> Path:
    """Write ``arrays`` (name -> array) and ``meta`` (JSON-able) to ``path``, checksum last.

    Durable and atomic (see the module docstring): ``path`` is either absent, the previous
    file or the complete new one, whenever the writer dies.
    """
    path = Path(checks.path(path, "path"))
    if _META in arrays:
        raise ValueError(f"the array name {_META!r} is reserved; got {sorted(arrays)}")
    tmp = path.with_name(path.name + TMP)
    try:
        with open(tmp, "w+b") as f:
            np.savez(f, **arrays, **{_META: json.dumps(meta)})
            with zipfile.ZipFile(f, "a") as zf:
                zf.comment = b"0" * _DIGEST_LEN  # reserves the checksum's place at the end
            end = f.seek(0, os.SEEK_END) - _DIGEST_LEN
            digest = _sha256(f, end)
            f.seek(end)
            f.write(digest)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return path


def read(path) -> tuple[dict[str, np.ndarray], dict]:
    """``(arrays, meta)`` exactly as :func:`write` got them; :class:`CorruptCheckpoint` if the
    file is not byte for byte what :func:`write` wrote (or cannot be opened)."""
    path = Path(checks.path(path, "path"))
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END) - _DIGEST_LEN
            f.seek(max(end, 0))
            stored = f.read()
            if end <= 0 or not re.fullmatch(rb"[0-9a-f]{64}", stored):
                raise CorruptCheckpoint(path, "its last 64 bytes are not a SHA-256 checksum "
                                              "(truncated, damaged at its end, or not written "
                                              "by coursekit's checkpoints)")
            if _sha256(f, end) != stored:
                raise CorruptCheckpoint(path, "checksum mismatch: the file is not byte for byte "
                                              "what was saved (damaged or edited)")
            f.seek(0)
            with np.load(f, allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
            meta = json.loads(str(arrays.pop(_META)))
    except OSError as exc:
        raise CorruptCheckpoint(path, f"unreadable ({exc})") from None
    return arrays, meta



def _name_pattern(template: str, parts: int) -> re.Pattern:
    """The names ``template`` makes: ``{key}`` and ``{part}`` any number (named groups),
    ``{parts}`` exactly ``parts``, the rest literally."""
    regex = ""
    for literal, name, _, _ in string.Formatter().parse(template):
        regex += re.escape(literal)
        if name == "parts":
            regex += str(parts)
        elif name is not None:
            regex += rf"(?P<{name}>\d+)"
    return re.compile(regex + r"\Z")


@dataclass(frozen=True)
class Series:
    """The checkpoint files of one run, ``parts`` files per key:
    ``template.format(key=, part=, parts=)`` names them (other files in the directory are
    ignored); ``unit`` / ``part_unit`` name a key and a part in messages ("step", "rank")."""

    directory: Path
    template: str
    parts: int
    unit: str
    part_unit: str

    def path(self, key: int, part: int) -> Path:
        return self.directory / self.template.format(key=key, part=part, parts=self.parts)

    def _parse(self, name: str) -> tuple[int, int] | None:
        """``(key, part)`` of a name :meth:`path` makes, else None."""
        m = _name_pattern(self.template, self.parts).match(name)
        kp = (int(m["key"]), int(m["part"])) if m else None
        return kp if kp is not None and self.path(*kp).name == name else None

    def listing(self) -> dict[int, dict[int, Path]]:
        """{key: {part: path}} of the complete (renamed) files in the directory."""
        found: dict[int, dict[int, Path]] = {}
        for p in self.directory.iterdir() if self.directory.is_dir() else ():
            if (kp := self._parse(p.name)) is not None:
                found.setdefault(kp[0], {})[kp[1]] = p
        return found

    def save(self, key: int, part: int, arrays: dict, meta: dict, keep: int) -> Path:
        """:func:`write` ``part``'s file for ``key``; then delete this part's files older than
        its newest ``keep`` and the ``.tmp`` files a killed save of this part left behind."""
        if {"key", "part"} & set(meta):
            raise ValueError(f"meta names 'key' and 'part' are reserved; got {sorted(meta)}")
        self.directory.mkdir(parents=True, exist_ok=True)
        path = write(self.path(key, part), arrays, {**meta, "key": key, "part": part})
        mine = sorted((k, files[part]) for k, files in self.listing().items() if part in files)
        for _, old in mine[:-keep]:
            old.unlink(missing_ok=True)
        for tmp in self.directory.glob("*" + TMP):
            kp = self._parse(tmp.name[:-len(TMP)])
            if kp is not None and kp[1] == part:
                tmp.unlink(missing_ok=True)
        return path

    def read(self, key: int, part: int) -> tuple[dict[str, np.ndarray], dict]:
        """``(arrays, meta)`` of ``part``'s file for ``key``, checked (:func:`read`) and holding
        the key and part its name says; :class:`CorruptCheckpoint` if not."""
        path = self.path(key, part)
        arrays, meta = read(path)
        held = (meta.pop("key", None), meta.pop("part", None))
        if held != (key, part):
            raise CorruptCheckpoint(path, f"holds {self.unit} {held[0]} of {self.part_unit} "
                                          f"{held[1]}, not what its name says: a copied or "
                                          "renamed file")
        return arrays, meta

    def _problem(self, key: int, part: int, files: dict[int, Path]) -> str | None:
        if part not in files:
            return f"{self.path(key, part).name}: missing ({self.part_unit} {part} never wrote it)"
        try:
            self.read(key, part)
        except CorruptCheckpoint as exc:
            return f"{exc.path.name}: {exc.reason}"
        return None

    def newest_valid(self) -> tuple[int | None, str]:
        """The newest key whose files for parts ``0 .. parts-1`` all exist and pass
        :meth:`read` (None if none), and what was wrong with the newer ones ("" if nothing).

        Skipping a newer key when a valid one exists warns :class:`CheckpointFallbackWarning`.
        """
        skipped: list[str] = []
        for key, files in sorted(self.listing().items(), reverse=True):
            problems = [p for part in range(self.parts)
                        if (p := self._problem(key, part, files))]
            if not problems:
                if skipped:
                    warnings.warn(
                        f"skipped damaged or incomplete checkpoint files in {self.directory}: "
                        f"{'; '.join(skipped)}. Using {self.unit} {key}, the newest whose files "
                        f"for all {self.parts} {self.part_unit}s are valid.",
                        CheckpointFallbackWarning, stacklevel=3)
                return key, ""
            skipped += problems
        return None, "; ".join(skipped)


class _State:
    """What :class:`RankState` and :class:`ShardState` share: one part's state for one key,
    saved as one file of a :class:`Series`. A subclass (a dataclass) names its key, part
    and part-count fields, its file names, how many files a part keeps, what to do when no
    checkpoint is usable, and how a loaded state is checked against this run
    (``_check_fits``). Array fields are stored as arrays, the others in the metadata; a
    field that is None is left out and loads as None."""

    KEY: ClassVar[str]      # the field that orders checkpoints: "step", "version"
    PART: ClassVar[str]     # the field naming who wrote the file: "rank", "shard"
    PARTS: ClassVar[str]    # the field counting the parts of one checkpoint
    FILE: ClassVar[str]     # file names: format fields {key}, {part} and optionally {parts}
    KEEP: ClassVar[int]     # files a part keeps (its newest)
    NONE_HINT: ClassVar[str]  # the advice when no checkpoint is usable

    @classmethod
    def _series(cls, directory, parts: int) -> Series:
        return Series(Path(checks.path(directory, "directory")), cls.FILE, parts, cls.KEY,
                      cls.PART)

    def save(self, directory, keep: int | None = None) -> Path:
        """Write this part's file for this key under ``directory`` (checksummed, durable,
        atomic) and return its path. This part's files older than its newest ``keep``
        (default :attr:`KEEP`) are deleted, and so are the ``.tmp`` files a killed save of
        this part left."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        key, part = values.pop(self.KEY), values.pop(self.PART)
        arrays = {k: v for k, v in values.items() if isinstance(v, np.ndarray)}
        meta = {k: v for k, v in values.items() if k not in arrays and v is not None}
        return self._series(directory, values[self.PARTS]).save(key, part, arrays, meta,
                                                                self.KEEP if keep is None else keep)

    @classmethod
    def latest(cls, directory, parts: int) -> int:
        """The newest key whose files from all ``parts`` parts exist and are intact (it warns
        :class:`CheckpointFallbackWarning` about newer ones it skipped); ValueError, naming
        every file it could not use, when there is none."""
        series = cls._series(directory, parts)
        key, skipped = series.newest_valid()
        if key is None:
            written = sorted({p for files in series.listing().values() for p in files})
            raise ValueError(f"no checkpoint in {directory} has intact files from all {parts} "
                             f"{cls.PART}s (files from {cls.PART}s {written or 'none'}"
                             f"{'; unusable: ' + skipped if skipped else ''}); {cls.NONE_HINT}")
        return key

    @classmethod
    def load(cls, directory, part: int, parts: int, **this_run):
        """Part ``part``'s state at :meth:`latest`, checked against ``this_run`` (the
        subclass's ``_check_fits`` says which settings); ValueError if none is usable or
        it does not fit."""
        key = cls.latest(directory, parts)
        series = cls._series(directory, parts)
        arrays, meta = series.read(key, part)
        values = {f.name: None for f in fields(cls)}  # a field saved as None was left out
        values.update(arrays)
        values.update(meta)
        values.update({cls.KEY: key, cls.PART: part})
        state = cls(**values)
        state._check_fits(series.path(key, part), **this_run)
        return state


@dataclass(frozen=True)
class RankState(_State):
    """One data-parallel rank's state after ``step`` steps (see the module docstring);
    ``size`` workers wrote the checkpoint, and ``fingerprint`` is what must not change
    between the run and its resumption (:meth:`~.data_parallel.DPConfig.fingerprint`)."""

    KEY, PART, PARTS = "step", "rank", "size"
    FILE = "ckpt-{key:08d}-rank{part}.npz"
    KEEP = 2  # a rank may delete its older file once it wrote a newer one: all ranks save
    #           each step together, so the previous step stays complete until they are done
    NONE_HINT = "resume with the same number of workers, or start without resume"

    rank: int
    size: int
    step: int
    params: np.ndarray
    velocity: np.ndarray  # empty when the optimizer has no state
    rng_state: dict       # np.random.Generator.bit_generator.state after the epoch's permutation
    permutation: np.ndarray
    fingerprint: str

    def _check_fits(self, path: Path, fingerprint: str) -> None:
        if self.fingerprint != fingerprint:
            raise ValueError(f"{path} was written by a different run ({self.fingerprint}); "
                             f"this run is ({fingerprint})")


@dataclass(frozen=True)
class ShardState(_State):
    """A parameter-server shard's state at ``version`` (see the module docstring): shard
    ``shard`` of ``n_shards`` holds parameters ``[lo, hi)``; ``velocity`` is None without
    momentum; ``clocks[w]`` is worker w's clock."""

    KEY, PART, PARTS = "version", "shard", "n_shards"
    FILE = "shard{part}of{parts}_v{key}.npz"
    KEEP = 3  # more than one: the other shards may still be writing a version this one passed
    NONE_HINT = "run with checkpoint_every > 0 first (or check the number of servers)"

    shard: int
    n_shards: int
    lo: int
    hi: int
    params: np.ndarray
    velocity: np.ndarray | None
    version: int
    applied: int
    clocks: np.ndarray

    def _check_fits(self, path: Path, lo: int, hi: int, workers: int) -> None:
        if (self.lo, self.hi) != (lo, hi):
            raise ValueError(f"{path} holds parameters [{self.lo}, {self.hi}) but this run's "
                             f"shard {self.shard} holds [{lo}, {hi}): the model or the number "
                             "of servers changed")
        if len(self.clocks) != workers:
            raise ValueError(f"{path} has clocks for {len(self.clocks)} workers; this run has "
                             f"{workers}: restart with the same number of workers")
