"""Training data on disk: one packed file that every worker memory-maps, or one file per sample.

The lecture's I/O tip: "don't read many small files, pack samples together into a few
large files". Both layouts are here with the same interface, ``source.rows(indices) ->
(X, y)`` and ``len(source)``, so the notebook can time them against each other:

* :class:`PackedFile` (``pack(X, y, path)``): one file, a small JSON header, then X and y
  as raw arrays at 64-byte aligned offsets. Every worker memory-maps it (the OS page
  cache shares one copy between all engines on a host) and reads only its own rows: a
  batch is one fancy-indexing gather, a few page faults the first time.
* :class:`SampleFiles` (``write_samples(X, y, directory)``): one ``.npy`` file per sample
  plus ``labels.npy``; a batch of b rows costs b file opens, i.e. b times the per-file
  latency of the file system (metadata, a system call or three each), which is what
  makes small-file data sets slow on shared file systems.
* :class:`ArraySource`: rows of arrays already in memory (tests, run_local).

All three pickle small (a path or the arrays), so they can be sent to engines.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from coursekit import checks

__all__ = ["ArraySource", "PackedFile", "SampleFiles", "as_source", "digest", "pack",
           "write_samples"]

MAGIC = b"COURSEKIT-PACK-1\n"
_ALIGN = 64


def _check_xy(X, y) -> tuple[np.ndarray, np.ndarray]:
    X, y = np.asarray(X), np.asarray(y)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, n_features); got shape {X.shape}")
    if len(y) != len(X):
        raise ValueError(f"X and y must have the same number of rows; got {len(X)} and {len(y)}")
    if len(X) == 0:
        raise ValueError("X has no rows; a data set needs at least one sample")
    return np.ascontiguousarray(X), np.ascontiguousarray(y)


class _Rows:
    """Shared ``rows`` logic: check indices, then gather."""

    def __len__(self) -> int:
        raise NotImplementedError

    def _gather(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def rows(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """(X[indices], y[indices]) as new in-memory arrays."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"row indices must lie in [0, {len(self)}); got "
                             f"{idx.min()}..{idx.max()}")
        return self._gather(idx)


class ArraySource(_Rows):
    """Rows of in-memory arrays ``X`` (n, d) and ``y`` (n, ...)."""

    def __init__(self, X, y):
        self.X, self.y = _check_xy(X, y)

    def __len__(self) -> int:
        return len(self.X)

    def _gather(self, idx):
        return self.X[idx], self.y[idx]


def pack(X, y, path) -> "PackedFile":
    """Write X and y into one file at ``path``; return it opened as a :class:`PackedFile`."""
    path = Path(checks.path(path, "path"))
    X, y = _check_xy(X, y)
    arrays, offset = {}, 0
    for name, arr in (("X", X), ("y", y)):
        arrays[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset}
        offset += -(-arr.nbytes // _ALIGN) * _ALIGN
    header = json.dumps(arrays).encode()
    start = -(-(len(MAGIC) + 8 + len(header)) // _ALIGN) * _ALIGN
    with open(path, "wb") as f:
        f.write(MAGIC + np.uint64(len(header)).tobytes() + header)
        for name, arr in (("X", X), ("y", y)):
            f.seek(start + arrays[name]["offset"])
            f.write(arr.tobytes())
        f.truncate(start + offset)
    return PackedFile(path)


class PackedFile(_Rows):
    """A file written by :func:`pack`, memory-mapped read-only on first use (per process)."""

    def __init__(self, path):
        self.path = Path(checks.path(path, "path"))
        self._maps = None
        self._open()  # fail early on a missing or foreign file

    def _open(self):
        if self._maps is None:
            if not self.path.is_file():
                raise FileNotFoundError(f"no packed data file at {self.path}; write one with "
                                        "coursekit.datafile.pack(X, y, path)")
            with open(self.path, "rb") as f:
                if f.read(len(MAGIC)) != MAGIC:
                    raise ValueError(f"{self.path} is not a coursekit packed data file")
                length = int(np.frombuffer(f.read(8), np.uint64)[0])
                arrays = json.loads(f.read(length))
            start = -(-(len(MAGIC) + 8 + length) // _ALIGN) * _ALIGN
            self._maps = {name: np.memmap(self.path, dtype=np.dtype(a["dtype"]), mode="r",
                                          offset=start + a["offset"], shape=tuple(a["shape"]))
                          for name, a in arrays.items()}
        return self._maps

    def __getstate__(self):
        return {"path": self.path}  # an engine maps the file itself

    def __setstate__(self, state):
        self.path, self._maps = state["path"], None

    def __len__(self) -> int:
        return len(self._open()["X"])

    @property
    def X(self) -> np.ndarray:
        """The memory-mapped X (read-only)."""
        return self._open()["X"]

    @property
    def y(self) -> np.ndarray:
        return self._open()["y"]

    def _gather(self, idx):
        maps = self._open()
        return np.asarray(maps["X"][idx]), np.asarray(maps["y"][idx])


def write_samples(X, y, directory) -> "SampleFiles":
    """Write one ``sample_<i>.npy`` per row of X (and ``labels.npy``) into ``directory``."""
    directory = Path(checks.path(directory, "directory"))
    X, y = _check_xy(X, y)
    directory.mkdir(parents=True, exist_ok=True)
    for i, row in enumerate(X):
        np.save(directory / f"sample_{i:07d}.npy", row)
    np.save(directory / "labels.npy", y)
    return SampleFiles(directory)


class SampleFiles(_Rows):
    """A directory written by :func:`write_samples`: every row read opens one file."""

    def __init__(self, directory):
        self.directory = Path(checks.path(directory, "directory"))
        labels = self.directory / "labels.npy"
        if not labels.is_file():
            raise FileNotFoundError(f"no labels.npy in {self.directory}; write the samples with "
                                    "coursekit.datafile.write_samples(X, y, directory)")
        self.y = np.load(labels)

    def __len__(self) -> int:
        return len(self.y)

    def _gather(self, idx):
        rows = [np.load(self._file(i)) for i in (idx if idx.size else [0])]
        X = np.stack(rows) if idx.size else np.empty((0,) + rows[0].shape, rows[0].dtype)
        return X, self.y[idx]

    def _file(self, i: int) -> Path:
        return self.directory / f"sample_{i:07d}.npy"


def as_source(data) -> _Rows:
    """A row source from a source, an ``(X, y)`` pair, or the path of a packed file."""
    if isinstance(data, _Rows):
        return data
    if isinstance(data, (str, Path)):
        return PackedFile(data)
    if isinstance(data, tuple) and len(data) == 2:
        return ArraySource(*data)
    raise TypeError("data must be an ArraySource/PackedFile/SampleFiles, an (X, y) pair or the "
                    f"path of a packed file; got {type(data).__name__}")


def digest(data, chunk: int = 4096) -> str:
    """The SHA-256 (first 16 hex digits) of every row of ``data`` (anything :func:`as_source`
    takes), in order, with each array's dtype and row shape: two sources have the same
    digest when they hold the same rows. A checkpoint records it so that a run resumed on
    other data is told so (:mod:`coursekit.parallel.checkpoint`). Reads ``chunk`` rows at a
    time, so a packed file larger than memory can be hashed."""
    source = as_source(data)
    n = len(source)
    X, y = hashlib.sha256(), hashlib.sha256()
    for start in range(0, n, chunk):
        for h, a in zip((X, y), source.rows(np.arange(start, min(start + chunk, n)))):
            if start == 0:
                h.update(f"{a.dtype.str}{a.shape[1:]}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
    whole = f"rows={n} X={X.hexdigest()} y={y.hexdigest()}"
    return hashlib.sha256(whole.encode()).hexdigest()[:16]
