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
``RankState.load`` / ``ShardState.load``, which take the newest checkpoint whose files are
complete, intact *and of this run*.

**Which run wrote it.** Every file records its run's ``fingerprint``: a dict of everything
that fixes the run's trajectory (the configuration's settings that matter, the topology,
the training data's :func:`coursekit.datafile.digest`; :meth:`~.data_parallel.DPConfig.fingerprint`,
:meth:`~.param_server.PSConfig.fingerprint`). A file whose fingerprint differs from this
run's (a file copied from another run, another seed, momentum, data or number of workers),
or whose arrays have another dtype or shape than this run needs, is *unusable* exactly as
a damaged one is: skipped with the fallback warning that names it and says what differs.

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
  :attr:`ShardState.KEEP`) older than the one it just wrote.
* **Nothing that is not this run's is deleted or overwritten.** A save replaces or deletes
  only regular files that hold this run's checkpoints. Anything else in the way of a save
  (a directory, a link, a damaged file, another run's file under the name it is about to
  write) is renamed to ``<name>.aside<n>`` and the save goes on, with a
  :class:`CheckpointMovedAsideWarning` naming both; a save never fails because its name is
  taken.
* **Fallback.** :meth:`Series.newest_valid` returns the newest key whose files exist, verify
  and fit this run for every part, and warns (:class:`CheckpointFallbackWarning`) naming each
  newer file it skipped and why. Every part checks every part's files, so all of them pick the
  same key without talking to each other; reading ``parts`` files per part is the price.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import string
import warnings
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import numpy as np

from coursekit import checks

__all__ = ["CheckpointFallbackWarning", "CheckpointMovedAsideWarning", "CorruptCheckpoint",
           "ForeignCheckpoint", "RankState", "Series", "ShardState", "UnusableCheckpoint", "read",
           "write"]

TMP = ".tmp"  # suffix of a file being written; renamed away once it is complete
_META = "__meta__"  # the array holding the metadata's JSON text
_DIGEST_LEN = 64  # hex characters of a SHA-256: the zip comment that ends every file
ASIDE = ".aside"  # what a save renames an obstacle to: <name>.aside1, <name>.aside2, ...
_RESERVED = ("key", "part", "fingerprint")  # metadata names a Series writes itself


class UnusableCheckpoint(ValueError):
    """A checkpoint file this run cannot resume from; ``path`` and ``reason`` say why."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = Path(path), reason


class CorruptCheckpoint(UnusableCheckpoint):
    """A checkpoint file is damaged or not what its name says; ``path`` and ``reason`` say how."""


class ForeignCheckpoint(UnusableCheckpoint):
    """An intact checkpoint file of another run (another fingerprint, or arrays of another
    dtype or shape than this run's); ``reason`` says what differs."""


class CheckpointFallbackWarning(UserWarning):
    """Newer checkpoint files were skipped (damaged, missing or another run's): an older
    checkpoint is used."""


class CheckpointMovedAsideWarning(UserWarning):
    """Something that is not this run's checkpoint was in the way of a save: it was renamed
    to ``<name>.aside<n>`` (kept, not deleted) and the save went on."""


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
    file or the complete new one, whenever the writer dies. A file or link left at
    ``<path>.tmp`` (a killed save's) is removed first, never written through: the link's
    target is not touched.
    """
    path = Path(checks.path(path, "path"))
    if _META in arrays:
        raise ValueError(f"the array name {_META!r} is reserved; got {sorted(arrays)}")
    tmp = path.with_name(path.name + TMP)
    try:
        if not stat.S_ISDIR(os.lstat(tmp).st_mode):
            tmp.unlink()
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)  # a new file: follows no link
    try:
        with open(fd, "w+b") as f:
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


def _same(theirs, ours) -> bool:
    """Equal as the JSON metadata stores them (a tuple reads back as a list)."""
    return json.loads(json.dumps(theirs)) == json.loads(json.dumps(ours))


def _differences(theirs, ours: dict) -> str:
    """What differs between a file's fingerprint and this run's, setting by setting."""
    if not isinstance(theirs, dict):
        return (f"it records no run fingerprint ({theirs!r}; written by an older coursekit "
                "or by hand)")
    theirs, ours = json.loads(json.dumps(theirs)), json.loads(json.dumps(ours))
    absent = "(not recorded)"
    return "; ".join(f"{k} {theirs.get(k, absent)!r} there, {ours.get(k, absent)!r} here"
                     for k in sorted(theirs.keys() | ours.keys())
                     if theirs.get(k, absent) != ours.get(k, absent))


def _obstacle(path: Path) -> str | None:
    """What is at ``path`` if it is not a regular file ("a directory", "a symbolic link", ...);
    None for a regular file; ``""`` for nothing."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return ""
    if stat.S_ISREG(mode):
        return None
    return ("a directory" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode)
            else "not a regular file")


def _move_aside(path: Path, why: str) -> Path:
    """Rename ``path`` to the first free ``<name>.aside<n>`` and warn
    :class:`CheckpointMovedAsideWarning` naming both and ``why``."""
    n = 1
    while os.path.lexists(aside := path.with_name(f"{path.name}{ASIDE}{n}")):
        n += 1
    os.rename(path, aside)
    warnings.warn(f"{path} was in the way of a checkpoint save ({why}): renamed it to "
                  f"{aside.name}, where it is kept; the save went on", CheckpointMovedAsideWarning,
                  stacklevel=4)
    return aside


@dataclass(frozen=True)
class Series:
    """The checkpoint files of one run, ``parts`` files per key:
    ``template.format(key=, part=, parts=)`` names them (other files in the directory are
    ignored); ``unit`` / ``part_unit`` name a key and a part in messages ("step", "rank").
    ``fingerprint`` (JSON-able, usually a dict) says which run this is: every file saved
    records it, a file recording another is unusable (:class:`ForeignCheckpoint`), and
    saves delete or overwrite only files that record it (None: no run check)."""

    directory: Path
    template: str
    parts: int
    unit: str
    part_unit: str
    fingerprint: object = None

    def __post_init__(self):
        object.__setattr__(self, "directory", Path(checks.path(self.directory, "directory")))
        checks.integer(self.parts, "parts", at_least=1)

    def path(self, key: int, part: int) -> Path:
        return self.directory / self.template.format(key=key, part=part, parts=self.parts)

    def _parse(self, name: str) -> tuple[int, int] | None:
        """``(key, part)`` of a name :meth:`path` makes, else None."""
        m = _name_pattern(self.template, self.parts).match(name)
        kp = (int(m["key"]), int(m["part"])) if m else None
        return kp if kp is not None and self.path(*kp).name == name else None

    def listing(self) -> dict[int, dict[int, Path]]:
        """{key: {part: path}} of the entries under checkpoint names in the directory (the
        complete, renamed files, and whatever else took such a name)."""
        found: dict[int, dict[int, Path]] = {}
        for p in self.directory.iterdir() if self.directory.is_dir() else ():
            if (kp := self._parse(p.name)) is not None:
                found.setdefault(kp[0], {})[kp[1]] = p
        return found

    def _ours(self, path: Path, key: int, part: int) -> bool:
        """Whether ``path`` is a regular file whose metadata says it is this run's file for
        ``key`` and ``part`` (read from the metadata alone, not checksummed: a file that says
        so may be replaced or deleted, as this run's own)."""
        if _obstacle(path) is not None:
            return False
        try:
            with np.load(path, allow_pickle=False) as npz:
                meta = json.loads(str(npz[_META]))
        except Exception:  # noqa: BLE001 - unreadable or not ours: either way, keep it
            return False
        return (isinstance(meta, dict) and (meta.get("key"), meta.get("part")) == (key, part)
                and _same(meta.get("fingerprint"), self.fingerprint))

    def _make_room(self, key: int, part: int) -> None:
        """Rename aside whatever is in the way of ``part``'s save of ``key``: a non-file at
        its ``.tmp`` name; at its name, anything but this run's own file for that key."""
        path = self.path(key, part)
        tmp = path.with_name(path.name + TMP)
        if what := _obstacle(tmp):
            _move_aside(tmp, f"{what} where the save writes its temporary file")
        what = _obstacle(path)
        if what is None and not self._ours(path, key, part):
            what = ("a file that is not this run's checkpoint (damaged, or another run's), "
                    "which the save would overwrite")
        if what:
            _move_aside(path, what)

    def save(self, key: int, part: int, arrays: dict, meta: dict, keep: int) -> Path:
        """:func:`write` ``part``'s file for ``key`` (moving aside, with a warning, whatever
        is in its way and is not this run's); then delete this run's files of this part
        older than ``key`` except the newest ``keep - 1``, and the ``.tmp`` files a killed
        save of this part left behind."""
        if set(_RESERVED) & set(meta):
            raise ValueError("meta names 'key', 'part' and 'fingerprint' are reserved (the "
                             f"series writes them); got {sorted(meta)}")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._make_room(key, part)
        path = write(self.path(key, part), arrays,
                     {**meta, "key": key, "part": part, "fingerprint": self.fingerprint})
        older = sorted((k, files[part]) for k, files in self.listing().items()
                       if part in files and k < key and self._ours(files[part], k, part))
        for _, old in older[:max(len(older) - (keep - 1), 0)]:
            old.unlink(missing_ok=True)
        for tmp in self.directory.glob("*" + TMP):
            kp = self._parse(tmp.name[:-len(TMP)])
            if kp is not None and kp[1] == part and _obstacle(tmp) is None:
                tmp.unlink(missing_ok=True)
        return path

    def read(self, key: int, part: int) -> tuple[dict[str, np.ndarray], dict]:
        """``(arrays, meta)`` of ``part``'s file for ``key``, checked (:func:`read`), holding
        the key and part its name says (else :class:`CorruptCheckpoint`) and written by this
        run (else :class:`ForeignCheckpoint`, naming every setting that differs)."""
        path = self.path(key, part)
        arrays, meta = read(path)
        held = (meta.pop("key", None), meta.pop("part", None))
        if held != (key, part):
            raise CorruptCheckpoint(path, f"holds {self.unit} {held[0]} of {self.part_unit} "
                                          f"{held[1]}, not what its name says: a copied or "
                                          "renamed file")
        theirs = meta.pop("fingerprint", None)
        if self.fingerprint is not None and not _same(theirs, self.fingerprint):
            raise ForeignCheckpoint(path, "written by a different run: "
                                          f"{_differences(theirs, self.fingerprint)}")
        return arrays, meta

    def _problem(self, key: int, part: int, files: dict[int, Path], fits) -> str | None:
        if part not in files:
            return f"{self.path(key, part).name}: missing ({self.part_unit} {part} never wrote it)"
        try:
            arrays, meta = self.read(key, part)
            misfit = fits(part, arrays, meta) if fits else None
        except UnusableCheckpoint as exc:
            return f"{exc.path.name}: {exc.reason}"
        return f"{self.path(key, part).name}: {misfit}" if misfit else None

    def newest_valid(self, fits=None) -> tuple[int | None, str]:
        """The newest key whose files for parts ``0 .. parts-1`` all exist, pass :meth:`read`
        and fit this run (None if none), and what was wrong with the newer ones ("" if
        nothing). ``fits(part, arrays, meta)``, if given, returns why an intact file of this
        run still does not fit (a wrong dtype or shape), or None.

        Skipping a newer key when a valid one exists warns :class:`CheckpointFallbackWarning`.
        """
        skipped: list[str] = []
        for key, files in sorted(self.listing().items(), reverse=True):
            problems = [p for part in range(self.parts)
                        if (p := self._problem(key, part, files, fits))]
            if not problems:
                if skipped:
                    warnings.warn(
                        f"skipped unusable checkpoint files (damaged, incomplete or another "
                        f"run's) in {self.directory}: {'; '.join(skipped)}. Using {self.unit} "
                        f"{key}, the newest whose files for all {self.parts} {self.part_unit}s "
                        "are valid.", CheckpointFallbackWarning, stacklevel=3)
                return key, ""
            skipped += problems
        return None, "; ".join(skipped)


def _describe(value) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    return "absent" if value is None else repr(value)


class _State:
    """What :class:`RankState` and :class:`ShardState` share: one part's state for one key
    of the run ``fingerprint``, saved as one file of a :class:`Series`. A subclass (a
    dataclass) names its key, part and part-count fields, its file names, how many files a
    part keeps and what to do when no checkpoint is usable. Array fields are stored as
    arrays, the others in the metadata; a field that is None is left out and loads as None."""

    KEY: ClassVar[str]      # the field that orders checkpoints: "step", "version"
    PART: ClassVar[str]     # the field naming who wrote the file: "rank", "shard"
    PARTS: ClassVar[str]    # the field counting the parts of one checkpoint
    FILE: ClassVar[str]     # file names: format fields {key}, {part} and optionally {parts}
    KEEP: ClassVar[int]     # files a part keeps (its newest)
    NONE_HINT: ClassVar[str]  # the advice when no checkpoint is usable

    @classmethod
    def _series(cls, directory, parts: int, fingerprint) -> Series:
        return Series(Path(checks.path(directory, "directory")), cls.FILE, parts, cls.KEY,
                      cls.PART, fingerprint)

    def save(self, directory, keep: int | None = None) -> Path:
        """Write this part's file for this key under ``directory`` (checksummed, durable,
        atomic) and return its path. This run's files of this part older than the newest
        ``keep`` (default :attr:`KEEP`) are deleted, and so are the ``.tmp`` files a killed
        save of this part left; whatever else is in the way is moved aside (the module
        docstring)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        key, part = values.pop(self.KEY), values.pop(self.PART)
        series = self._series(directory, values[self.PARTS], values.pop("fingerprint"))
        arrays = {k: v for k, v in values.items() if isinstance(v, np.ndarray)}
        meta = {k: v for k, v in values.items() if k not in arrays and v is not None}
        return series.save(key, part, arrays, meta, self.KEEP if keep is None else keep)

    @classmethod
    def _misfit(cls, part: int, arrays: dict, meta: dict, want: dict) -> str | None:
        """Why the file of ``part`` does not fit ``want`` ({field: value this run needs; an
        array stands for its dtype and shape}), or None."""
        for name, need in want.items():
            got = arrays.get(name, meta.get(name))
            if isinstance(need, np.ndarray):
                ok = isinstance(got, np.ndarray) and (got.dtype, got.shape) == (need.dtype,
                                                                                need.shape)
            else:
                ok = (got is None) == (need is None) and (need is None or _same(got, need))
            if not ok:
                return (f"its {name} is {_describe(got)} but this run's {cls.PART} {part} needs "
                        f"{_describe(need)}")
        return None

    @classmethod
    def latest(cls, directory, parts: int, fingerprint=None, like=None) -> int:
        """The newest key whose files from all ``parts`` parts exist, are intact and are of
        the run ``fingerprint`` (None: any run) with the fields ``like(part)`` says (see
        :meth:`load`); it warns :class:`CheckpointFallbackWarning` about newer ones it
        skipped. ValueError, naming every file it could not use and why, when there is none."""
        series = cls._series(directory, parts, fingerprint)
        fits = None if like is None else (
            lambda part, arrays, meta: cls._misfit(part, arrays, meta, like(part)))
        key, skipped = series.newest_valid(fits)
        if key is None:
            written = sorted({p for files in series.listing().values() for p in files})
            raise ValueError(f"no checkpoint in {directory} has intact files from all {parts} "
                             f"{cls.PART}s (files from {cls.PART}s "
                             f"{written or 'none'}{'; unusable: ' + skipped if skipped else ''}); "
                             f"{cls.NONE_HINT}")
        return key

    @classmethod
    def load(cls, directory, part: int, parts: int, fingerprint, like=None):
        """Part ``part``'s state at :meth:`latest`: the newest checkpoint whose every file is
        intact, records ``fingerprint`` and has the fields ``like(part)`` gives
        ({field: value}; an array value stands for the dtype and shape the field must
        have). Newer unusable files are skipped with a warning; ValueError if none is usable."""
        key = cls.latest(directory, parts, fingerprint, like)
        arrays, meta = cls._series(directory, parts, fingerprint).read(key, part)
        values = {f.name: None for f in fields(cls)}  # a field saved as None was left out
        values.update(arrays)
        values.update(meta)
        values.update({cls.KEY: key, cls.PART: part, "fingerprint": fingerprint})
        return cls(**values)


@dataclass(frozen=True)
class RankState(_State):
    """One data-parallel rank's state after ``step`` steps (see the module docstring);
    ``size`` workers wrote the checkpoint, and ``fingerprint`` says which run
    (:meth:`~.data_parallel.DPConfig.fingerprint`)."""

    KEY, PART, PARTS = "step", "rank", "size"
    FILE = "ckpt-{key:08d}-rank{part}.npz"
    KEEP = 2  # a rank may delete its older file once it wrote a newer one: all ranks save
    #           each step together, so the previous step stays complete until they are done
    NONE_HINT = "resume with the same settings and number of workers, or start without resume"

    rank: int
    size: int
    step: int
    params: np.ndarray
    velocity: np.ndarray  # empty when the optimizer has no state
    rng_state: dict       # np.random.Generator.bit_generator.state after the epoch's permutation
    permutation: np.ndarray
    fingerprint: dict


@dataclass(frozen=True)
class ShardState(_State):
    """A parameter-server shard's state at ``version`` (see the module docstring): shard
    ``shard`` of ``n_shards`` holds parameters ``[lo, hi)``; ``velocity`` is None without
    momentum; ``clocks[w]`` is worker w's clock; ``fingerprint`` says which run
    (:meth:`~.param_server.PSConfig.fingerprint`)."""

    KEY, PART, PARTS = "version", "shard", "n_shards"
    FILE = "shard{part}of{parts}_v{key}.npz"
    KEEP = 3  # more than one: the other shards may still be writing a version this one passed
    NONE_HINT = ("run with checkpoint_every > 0 first (with the same settings, servers and "
                 "workers), or start without resume")

    shard: int
    n_shards: int
    lo: int
    hi: int
    params: np.ndarray
    velocity: np.ndarray | None
    version: int
    applied: int
    clocks: np.ndarray
    fingerprint: dict
