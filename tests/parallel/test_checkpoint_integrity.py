"""Checkpoints (coursekit.parallel.checkpoint) are tamper- and crash-evident (issue 17, both
states: data-parallel ranks and parameter-server shards). A truncated, bit-flipped, tampered, copied, missing or half-written
file is detected; resume falls back to the newest step whose files are all valid, names
the bad file and why, and loads exactly what was saved there; with nothing valid left it
fails naming every file. A SIGKILL in the middle of a save never leaves a damaged file under
a checkpoint's name, and a resumed training run still ends bit for bit where an
uninterrupted one does.

Run as a script (``python tests/parallel/test_checkpoint_integrity.py DIR START``), this file is
the writer that the SIGKILL test kills: it saves ever newer large checkpoints into DIR.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
import zipfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from coursekit.data import load_digits
from coursekit.parallel import data_parallel
from coursekit.parallel.param_server import async_sgd
from coursekit.parallel.param_server import PSConfig
from coursekit.parallel.checkpoint import (CheckpointFallbackWarning, CorruptCheckpoint, RankState,
                                           Series, ShardState, read, write)
from coursekit.parallel.data_parallel import DPConfig
from coursekit.cluster.runner import LocalRunner, RankFailure

PARTS = 2      # ranks / shards per checkpoint
KEYS = (5, 10)  # the steps / versions saved
N = 3000       # float64 values per array: the middle of a file lies in the arrays
FP = "integrity-test"


# ---- the two states, behind one interface -------------------------------------------------------
def _dp_checkpoint(step: int, rank: int, n: int = N) -> RankState:
    rng = np.random.default_rng([step, rank])
    return RankState(rank, PARTS, step, rng.standard_normal(n), rng.standard_normal(n),
                     rng.bit_generator.state, rng.permutation(50), FP)


def _dp_resume(directory) -> tuple[int, list[dict]]:
    states = [RankState.load(directory, rank, PARTS, fingerprint=FP) for rank in range(PARTS)]
    return states[0].step, [asdict(s) for s in states]


def _ps_state(version: int, shard: int, n: int = N) -> ShardState:
    rng = np.random.default_rng([version, shard, 7])
    return ShardState(shard, PARTS, shard * n, (shard + 1) * n, rng.standard_normal(n),
                      rng.standard_normal(n), version, 3 * version, rng.integers(0, 100, 4), FP)


def _ps_resume(directory) -> tuple[int, list[dict]]:
    states = [ShardState.load(directory, k, PARTS, FP) for k in range(PARTS)]
    return states[0].version, [asdict(s) for s in states]


@dataclass(frozen=True)
class Writer:
    name: str
    unit: str                                      # what a checkpoint's key counts
    file: Callable[[int, int], str]                # (key, part) -> file name
    save: Callable[..., None]                      # (dir, key, part, n=N): write that state
    expected: Callable[[int, int], dict]           # the state saved for (key, part)
    resume: Callable[[Path], tuple[int, list]]     # the resumed key and every part's state
    none_left: str                                 # the error when no checkpoint is valid
    meta_field: str                                # a metadata field a flipped byte can change


WRITERS = [
    Writer("data-parallel", "step", lambda k, p: f"ckpt-{k:08d}-rank{p}.npz",
           lambda d, k, p, n=N: _dp_checkpoint(k, p, n).save(d),
           lambda k, p: asdict(_dp_checkpoint(k, p)), _dp_resume,
           rf"no checkpoint in .* has intact files from all {PARTS} ranks", '"size": '),
    Writer("parameter-server", "version", lambda k, p: f"shard{p}of{PARTS}_v{k}.npz",
           lambda d, k, p, n=N: _ps_state(k, p, n).save(d),
           lambda k, p: asdict(_ps_state(k, p)), _ps_resume,
           rf"no checkpoint in .* has intact files from all {PARTS} shards", '"applied": '),
]


def assert_same_state(got: dict, want: dict) -> None:
    """Equal field by field; arrays in dtype, shape and every bit."""
    assert got.keys() == want.keys()
    for field, value in want.items():
        if isinstance(value, np.ndarray):
            assert (got[field].dtype, got[field].shape) == (value.dtype, value.shape), field
            assert got[field].tobytes() == value.tobytes(), field
        else:
            assert got[field] == value, field


# ---- the damage --------------------------------------------------------------------------------
def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path, writer: Writer) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_middle(path: Path, writer: Writer) -> None:
    _flip(path, path.stat().st_size // 2)


def flip_metadata(path: Path, writer: Writer) -> None:
    """Change the first digit of a metadata number (NumPy stores text as UTF-32-LE)."""
    at = path.read_bytes().find(writer.meta_field.encode("utf-32-le"))
    assert at > 0
    data = bytearray(path.read_bytes())
    data[at + 4 * len(writer.meta_field)] ^= 0x01  # "3" <-> "2": still a valid number
    path.write_bytes(bytes(data))


def tamper(path: Path, writer: Writer) -> None:
    """Edited and re-saved as a well-formed .npz (every zip CRC right) that keeps its old
    checksum: the params differ by one ulp."""
    with zipfile.ZipFile(path) as z:
        stale = z.comment
    with np.load(path) as f:
        entries = {name: f[name] for name in f.files}
    entries["params"] = entries["params"].copy()
    entries["params"][0] = np.nextafter(entries["params"][0], np.inf)
    with open(path, "wb") as f:
        np.savez(f, **entries)
    with zipfile.ZipFile(path, "a") as z:
        z.comment = stale


def copy_other_part(path: Path, writer: Writer) -> None:
    """Part 0's intact file copied over part 1's."""
    key = next(k for k in KEYS if writer.file(k, 1) == path.name)
    shutil.copyfile(path.with_name(writer.file(key, 0)), path)


def delete(path: Path, writer: Writer) -> None:
    path.unlink()


def half_written_tmp(path: Path, writer: Writer) -> None:
    """Killed while writing: half the file under ``<name>.tmp``, nothing under ``<name>``."""
    path.with_name(path.name + ".tmp").write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    path.unlink()


MISMATCH = r"checksum mismatch: the file is not byte for byte what was saved"
CASES = {  # damage -> the reason the warning or error must give
    "truncated": (truncate, r"its last 64 bytes are not a SHA-256 checksum \(truncated"),
    "byte flipped mid-file": (flip_middle, MISMATCH),
    "byte flipped in metadata": (flip_metadata, MISMATCH),
    "tampered, checksum stale": (tamper, MISMATCH),
    "another part's file": (copy_other_part, r"holds \w+ \d+ of \w+ 0, not what its name says"),
    "deleted": (delete, r"missing"),
    "half-written .tmp": (half_written_tmp, r"missing"),
}


def _save_all(directory: Path, writer: Writer, keys=KEYS) -> None:
    for key in keys:
        for part in range(PARTS):
            writer.save(directory, key, part)


# ---- fallback and errors -----------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.name)
def test_resume_falls_back_past_a_bad_newest_file_and_says_so(tmp_path, writer, case):
    damage, reason = CASES[case]
    _save_all(tmp_path, writer)
    bad = tmp_path / writer.file(10, 1)
    damage(bad, writer)
    with pytest.warns(CheckpointFallbackWarning) as record:
        key, states = writer.resume(tmp_path)
    assert key == 5
    for part, state in enumerate(states):
        assert_same_state(state, writer.expected(5, part))
    message = "\n".join(str(w.message) for w in record if w.category is CheckpointFallbackWarning)
    assert re.search(rf"{re.escape(bad.name)}: {reason}", message), message
    assert f"Using {writer.unit} 5, the newest whose files for all {PARTS}" in message


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.name)
def test_with_no_valid_checkpoint_left_resume_names_every_bad_file(tmp_path, writer, case):
    damage, reason = CASES[case]
    _save_all(tmp_path, writer)
    for key in KEYS:
        damage(tmp_path / writer.file(key, 1), writer)
    with pytest.raises(ValueError, match=writer.none_left) as error:
        writer.resume(tmp_path)
    for key in KEYS:
        assert re.search(rf"{re.escape(writer.file(key, 1))}: {reason}", str(error.value))


@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.name)
def test_leftover_tmp_files_are_ignored_and_removed_by_their_parts_next_save(tmp_path, writer):
    _save_all(tmp_path, writer, keys=(5,))
    tmps = [tmp_path / (writer.file(10, part) + ".tmp") for part in range(PARTS)]
    for tmp in tmps:  # both parts killed while writing key 10
        tmp.write_bytes(b"PK\x03\x04 half a zip")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a .tmp is not a checkpoint: nothing to warn about
        assert writer.resume(tmp_path)[0] == 5
    writer.save(tmp_path, 15, 1)
    assert [t.exists() for t in tmps] == [True, False]  # part 0 may still be writing its own
    writer.save(tmp_path, 15, 0)
    assert not list(tmp_path.glob("*.tmp"))
    assert writer.resume(tmp_path)[0] == 15


@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.name)
def test_every_single_flipped_byte_anywhere_in_a_file_is_detected(tmp_path, writer):
    """Flip each byte of a small checkpoint file in turn (zip and .npy headers, arrays,
    metadata, the checksum itself): the read refuses every one."""
    writer.save(tmp_path, 10, 1, 4)  # a small file (1.4 or 2.5 kB): one read per byte
    path = tmp_path / writer.file(10, 1)
    pristine = path.read_bytes()
    for offset in range(len(pristine)):
        _flip(path, offset)
        with pytest.raises(CorruptCheckpoint, match="checksum"):
            read(path)
        path.write_bytes(pristine)
    read(path)  # and the pristine file passes


def test_reserved_names_are_refused_with_what_is_reserved(tmp_path):
    with pytest.raises(ValueError, match=r"the array name '__meta__' is reserved"):
        write(tmp_path / "x.npz", {"__meta__": np.zeros(1)}, {})
    with pytest.raises(ValueError, match=r"meta names 'key', 'part' and 'fingerprint' are "
                                         r"reserved \(the series writes them\); got \['key'\]"):
        Series(tmp_path, "f{key}-{part}.npz", 1, "step", "rank").save(1, 0, {}, {"key": 2}, keep=2)


def test_a_series_reads_only_the_names_its_template_makes(tmp_path):
    series = Series(tmp_path, "shard{part}of{parts}_v{key}.npz", 2, "version", "shard")
    for name in ("shard0of2_v5.npz", "shard1of2_v5.npz", "shard0of3_v7.npz", "shard0of2_v05.npz",
                 "shard0of2_v6.npz.tmp", "xshard0of2_v8.npz", "shard0of2_v9.npzx", "notes.txt"):
        (tmp_path / name).touch()
    assert series.listing() == {5: {0: tmp_path / "shard0of2_v5.npz",
                                     1: tmp_path / "shard1of2_v5.npz"}}
    padded = Series(tmp_path, "ckpt-{key:08d}-rank{part}.npz", 2, "step", "rank")
    (tmp_path / "ckpt-5-rank0.npz").touch()  # not padded: not a name this template makes
    (tmp_path / "ckpt-00000005-rank1.npz").touch()
    assert padded.listing() == {5: {1: tmp_path / "ckpt-00000005-rank1.npz"}}


# ---- a real kill -9 during a save ----------------------------------------------------------------
N_BIG = 2_000_000  # 16 MB of float64 per file: a save takes a good fraction of a second


def _big_checkpoint(base: np.ndarray, step: int, rank: int) -> RankState:
    rng = np.random.default_rng([step, rank])
    return RankState(rank, PARTS, step, base + (step + rank / 2), np.empty(0),
                     rng.bit_generator.state, rng.permutation(100), FP)


def _base() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(N_BIG)


def _save_forever(directory: str, step: int) -> None:
    """The victim: rank 0 then rank 1 save step, step + 1, ... until killed."""
    base = _base()
    while True:
        for rank in range(PARTS):
            _big_checkpoint(base, step, rank).save(directory)
        step += 1


def _fresh_tmp(directory: Path, since_ns: int) -> bool:
    """Whether a ``.tmp`` written since ``since_ns`` (time.time_ns) is in ``directory``."""
    for tmp in directory.glob("*.tmp"):
        try:
            if tmp.stat().st_mtime_ns >= since_ns:
                return True
        except FileNotFoundError:  # renamed into place meanwhile
            pass
    return False


def _run_until_killed(directory: Path, start: int, wait_for: str, delay: float,
                      log: Path) -> bool:
    """Start the victim at step ``start``; SIGKILL it ``delay`` s after ``wait_for``: "launch"
    (it starts), "write" (it begins writing a file) or "step" (both ranks of ``start`` are
    saved, so the resumed step moves on however slow the machine). Returns whether the kill
    left a fresh ``.tmp``, i.e. struck in the middle of a write."""
    launched = time.time_ns()
    ready = {"launch": lambda: True,
             "write": lambda: _fresh_tmp(directory, launched),
             "step": lambda: (directory / f"ckpt-{start:08d}-rank{PARTS - 1}.npz").exists()}
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, __file__, str(directory), str(start)],
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while not ready[wait_for]() and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(delay)
        assert proc.poll() is None, f"the victim died by itself: {log.read_text()}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return _fresh_tmp(directory, launched)


@pytest.mark.slow  # five processes killed by SIGKILL at timed moments of their saves
def test_sigkill_in_the_middle_of_saves_never_loads_a_wrong_state(tmp_path):
    rng = np.random.default_rng(17)
    base = _base()
    directory = tmp_path / "ckpt"
    for rank in range(PARTS):
        _big_checkpoint(base, 0, rank).save(directory)
    step, killed_mid_write, resumed = 0, 0, []
    # kill within 10 ms of a write's start (3 times); 0.5 to 2 s after the launch (while it
    # imports, hashes, writes or deletes); and up to 0.3 s after it saved a whole step (on a
    # loaded machine the timed kills alone may all strike before any step is whole)
    for wait_for, window in [("write", (0, 0.01)), ("launch", (0.5, 2.0)), ("write", (0, 0.01)),
                             ("step", (0, 0.3)), ("write", (0, 0.01))]:
        killed_mid_write += _run_until_killed(directory, step + 1, wait_for,
                                              rng.uniform(*window), tmp_path / "victim.log")
        for final in directory.glob("*.npz"):  # renamed files are always whole
            read(final)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step, states = _dp_resume(directory)
        for rank, state in enumerate(states):
            assert_same_state(state, asdict(_big_checkpoint(base, step, rank)))
        newer = sorted(p.name for p in directory.glob("*.npz")
                       if int(p.name[5:13]) > step)  # a step only rank 0 finished
        if newer:
            assert newer == [f"ckpt-{step + 1:08d}-rank0.npz"]
            assert f"ckpt-{step + 1:08d}-rank1.npz: missing" in str(caught[0].message)
        resumed.append(step)
    assert killed_mid_write >= 3 and resumed == sorted(resumed) and resumed[-1] > 0
    for rank in range(PARTS):  # the next save cleans up what the kills left
        _big_checkpoint(base, step + 1, rank).save(directory)
    assert not list(directory.glob("*.tmp"))
    assert _dp_resume(directory)[0] == step + 1


# ---- through the real training resume paths -----------------------------------------------------
def test_data_parallel_resume_skips_a_corrupt_newest_checkpoint_and_ends_bit_for_bit(tmp_path):
    d = load_digits(dtype=np.float64)
    data = d.X_train[:200], d.y_train[:200]
    config = DPConfig(sizes=(64, 16, 10), dtype="float64", batch_size=24, epochs=3, lr=0.1,
                      momentum=0.9, seed=1, publish_interval=0.0, checkpoint_dir=str(tmp_path),
                      checkpoint_every=5)
    threads = LocalRunner(3, comm_timeout=5)
    whole = data_parallel.train(threads, replace(config, checkpoint_dir=str(tmp_path / "w")), data)
    with pytest.raises(RankFailure, match="WorkerCrashed"):
        data_parallel.train(threads, replace(config, crash_rank=2, crash_step=13), data)
    flip_middle(tmp_path / "ckpt-00000010-rank1.npz", WRITERS[0])
    with pytest.warns(CheckpointFallbackWarning,
                      match=r"ckpt-00000010-rank1\.npz: checksum mismatch.*Using step 5"):
        resumed = data_parallel.train(threads, config, data, resume=True)
    assert resumed.first_step == 5
    np.testing.assert_array_equal(resumed.params, whole.params)  # bit for bit
    np.testing.assert_array_equal(resumed.loss, whole.loss[5:])


def test_parameter_server_restart_skips_a_corrupt_newest_checkpoint(tmp_path):
    digits = load_digits()
    common = dict(model="ssp", momentum=0.9, dtype="float64", jitter=0.001)
    threads = LocalRunner(5)  # 2 server shards, 3 workers
    straight = async_sgd.train(threads, PSConfig(steps=20, **common), digits, servers=2)
    async_sgd.train(threads, PSConfig(steps=14, checkpoint_every=5, checkpoint_dir=str(tmp_path),
                                      **common), digits, servers=2)
    tamper(tmp_path / "shard1of2_v10.npz", WRITERS[1])
    with pytest.warns(CheckpointFallbackWarning,
                      match=r"shard1of2_v10\.npz: checksum mismatch.*Using version 5"):
        again = async_sgd.train(threads, PSConfig(steps=20, resume=True,
                                                  checkpoint_dir=str(tmp_path), **common), digits,
                                servers=2)
    assert [w.steps for w in again.workers] == [15, 15, 15]  # from version 5, not 10
    assert again.applied == 3 * 20 and again.servers[0].version == 20
    assert np.array_equal(again.params, straight.params)  # momentum included


if __name__ == "__main__":
    _save_forever(sys.argv[1], int(sys.argv[2]))
