"""Checkpoint files that prove they are whole: a checksum inside, a durable write, a checked read.

A checkpoint is a set of files, one per *part* (a rank, a shard) for one *key* (a step, a
version), named by a :class:`Series`. Both writers, :mod:`.data_parallel.checkpoint`
(synchronous training) and :mod:`.param_server.checkpoint` (parameter server), get the same
guarantees from here:

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
  :meth:`Series.save` deletes.
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
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["CheckpointFallbackWarning", "CorruptCheckpoint", "Series", "read", "write"]

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
    path = Path(path)
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
    path = Path(path)
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


@dataclass(frozen=True)
class Series:
    """The checkpoint files of one run: ``template.format(key=, part=)`` names them and
    ``pattern`` (named groups ``key`` and ``part``) reads such a name back; other files in
    the directory are ignored.
    ``unit`` / ``part_unit`` name a key and a part in messages ("step", "rank")."""

    directory: Path
    template: str
    pattern: re.Pattern
    unit: str
    part_unit: str

    def path(self, key: int, part: int) -> Path:
        return self.directory / self.template.format(key=key, part=part)

    def _parse(self, name: str) -> tuple[int, int] | None:
        """``(key, part)`` of a name :meth:`path` makes, else None."""
        m = self.pattern.match(name)
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

    def newest_valid(self, parts: int) -> tuple[int | None, str]:
        """The newest key whose files for parts ``0 .. parts-1`` all exist and pass
        :meth:`read` (None if none), and what was wrong with the newer ones ("" if nothing).

        Skipping a newer key when a valid one exists warns :class:`CheckpointFallbackWarning`.
        """
        skipped: list[str] = []
        for key, files in sorted(self.listing().items(), reverse=True):
            problems = [p for part in range(parts) if (p := self._problem(key, part, files))]
            if not problems:
                if skipped:
                    warnings.warn(
                        f"skipped damaged or incomplete checkpoint files in {self.directory}: "
                        f"{'; '.join(skipped)}. Using {self.unit} {key}, the newest whose files "
                        f"for all {parts} {self.part_unit}s are valid.",
                        CheckpointFallbackWarning, stacklevel=3)
                return key, ""
            skipped += problems
        return None, "; ".join(skipped)
