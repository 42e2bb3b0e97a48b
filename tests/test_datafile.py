"""Packed data file (memory-mapped, sliced per worker) and one-file-per-sample loading."""

import pickle

import numpy as np
import pytest

from coursekit.datafile import (ArraySource, PackedFile, SampleFiles, as_source, digest, pack,
                                write_samples)


@pytest.fixture
def xy():
    rng = np.random.default_rng(0)
    return rng.standard_normal((37, 5)).astype(np.float32), rng.integers(0, 10, 37)


def test_packed_file_round_trips_and_is_memory_mapped(tmp_path, xy):
    X, y = xy
    packed = pack(X, y, tmp_path / "d.pack")
    assert len(packed) == 37 and isinstance(packed.X, np.memmap) and not packed.X.flags.writeable
    np.testing.assert_array_equal(packed.X, X)
    np.testing.assert_array_equal(packed.y, y)
    idx = [36, 0, 5, 5]
    for source in (packed, write_samples(X, y, tmp_path / "samples"), ArraySource(X, y)):
        Xb, yb = source.rows(idx)
        np.testing.assert_array_equal(Xb, X[idx])
        np.testing.assert_array_equal(yb, y[idx])
        assert source.rows([])[0].shape == (0, 5)


def test_packed_file_pickles_as_its_path(tmp_path, xy):
    packed = pack(*xy, tmp_path / "d.pack")
    blob = pickle.dumps(packed)
    assert len(blob) < 500  # the path, not the data: each engine maps the file itself
    np.testing.assert_array_equal(pickle.loads(blob).rows([3])[0], xy[0][[3]])


def test_sample_files_are_one_file_per_row(tmp_path, xy):
    write_samples(*xy, tmp_path)
    assert len(list(tmp_path.glob("sample_*.npy"))) == 37
    assert len(SampleFiles(tmp_path)) == 37


def test_as_source_accepts_pairs_paths_and_sources(tmp_path, xy):
    pack(*xy, tmp_path / "d.pack")
    assert isinstance(as_source(str(tmp_path / "d.pack")), PackedFile)
    assert isinstance(as_source(xy), ArraySource)
    with pytest.raises(TypeError, match="data must be an ArraySource/PackedFile/SampleFiles"):
        as_source([1, 2, 3])


def test_bad_files_and_rows_are_rejected(tmp_path, xy):
    with pytest.raises(FileNotFoundError, match="no packed data file"):
        PackedFile(tmp_path / "missing.pack")
    (tmp_path / "foreign").write_bytes(b"hello world, not a pack")
    with pytest.raises(ValueError, match="is not a coursekit packed data file"):
        PackedFile(tmp_path / "foreign")
    with pytest.raises(FileNotFoundError, match="no labels.npy"):
        SampleFiles(tmp_path)
    with pytest.raises(IndexError, match=r"row indices must lie in \[0, 37\); got 0..37"):
        ArraySource(*xy).rows([0, 37])
    with pytest.raises(ValueError, match="same number of rows"):
        pack(xy[0], xy[1][:3], tmp_path / "x.pack")


def test_digest_names_the_rows_whatever_holds_them_and_changes_with_any_value(tmp_path):
    """A checkpoint records it (coursekit.parallel.checkpoint): the same rows in a packed
    file, in memory or read in other chunks give the same digest; one value, the row order
    or a dtype changed gives another."""
    rng = np.random.default_rng(3)
    X, y = rng.standard_normal((50, 4)), rng.integers(0, 3, 50)
    same = {digest((X, y)), digest((X, y), chunk=7), digest(pack(X, y, tmp_path / "p.bin")),
            digest(write_samples(X, y, tmp_path / "s"), chunk=1)}
    assert len(same) == 1
    X2 = X.copy()
    X2[31, 2] = np.nextafter(X2[31, 2], np.inf)
    others = [digest((X2, y)), digest((X[::-1], y[::-1])), digest((X.astype(np.float32), y)),
              digest((X, y + 1)), digest((X[:49], y[:49]))]
    assert len(set(others) | same) == len(others) + 1
