"""Checkpoints know their run (issue 29, item 3). Every file records the fingerprint of the run
that wrote it; resuming through the real training paths (data parallel on ThreadComm ranks,
the parameter server's shards) with the newest file damaged in each way a directory can damage
it (another run's file, another topology's or data's, wrong dtype or shape, truncated, a
directory, a symlink to elsewhere, unreadable) either resumes from it and ends bit for bit
where the uninterrupted run ends, or skips it with the fallback warning naming the file and
why, falls back to the older checkpoint and still ends bit for bit there. A save never fails
because something occupies its name, and never deletes or overwrites what is not this run's.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from coursekit.data import load_digits
from coursekit.datafile import digest
from coursekit.parallel import data_parallel
from coursekit.parallel.checkpoint import (CheckpointFallbackWarning, CheckpointMovedAsideWarning,
                                           RankState, Series, ShardState, read)
from coursekit.parallel.data_parallel import DPConfig
from coursekit.parallel.param_server import PSConfig, PSTopology, async_sgd
from coursekit.cluster.runner import LocalRunner, RankFailure


def _resume(run: Callable):
    """``run()``'s result and the messages of the fallback and moved-aside warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run()
    said = {cat: "\n".join(str(w.message) for w in caught if w.category is cat)
            for cat in (CheckpointFallbackWarning, CheckpointMovedAsideWarning)}
    return result, said[CheckpointFallbackWarning], said[CheckpointMovedAsideWarning]


# ---- the two training paths, each with its uninterrupted run, its crashed run's checkpoints
# ---- (keys 5 and 10) and the checkpoints of a few other runs (key 10 among them) -----------
@dataclass
class World:
    name: str
    unit: str
    newest: str                       # the file the damage hits: part 1's, at key 10
    pristine: Path                    # the crashed run's checkpoint directory
    foreign: dict                     # "seed" / "momentum", "topology", "data" -> a directory
    whole: np.ndarray                 # the uninterrupted run's final parameters
    resume: Callable[[Path], tuple]   # (directory) -> (final params, first key resumed from)
    wrong_dtype: Callable[[Path], None]  # save a this-run file for key 10 with float32 params


@pytest.fixture(scope="module")
def dp(tmp_path_factory, digits_f64) -> World:
    base = tmp_path_factory.mktemp("dp")
    data = digits_f64.X_train[:200], digits_f64.y_train[:200]
    config = DPConfig(sizes=(64, 16, 10), dtype="float64", batch_size=24, epochs=3, lr=0.1,
                      momentum=0.9, seed=1, publish_interval=0.0, checkpoint_every=5,
                      checkpoint_dir=str(base / "unused"))
    threads = LocalRunner(3, comm_timeout=5)

    def at(name, **kw):
        return replace(config, checkpoint_dir=str(base / name), **kw)

    whole = data_parallel.train(threads, at("whole"), data).params
    with pytest.raises(RankFailure, match="WorkerCrashed"):
        data_parallel.train(threads, at("pristine", crash_rank=2, crash_step=13), data)
    data_parallel.train(threads, at("seed", seed=2, max_steps=10), data)
    data_parallel.train(LocalRunner(2), at("topology", max_steps=10), data)
    other = digits_f64.X_train[200:400], digits_f64.y_train[200:400]
    data_parallel.train(threads, at("data", max_steps=10), other)

    def resume(directory):
        r = data_parallel.train(threads, replace(config, checkpoint_dir=str(directory)), data,
                                resume=True)
        return r.params, r.first_step

    def wrong_dtype(directory):
        good = RankState.load(directory, 1, 3, config.fingerprint(3, digest(data)))
        replace(good, params=good.params.astype(np.float32)).save(directory)

    return World("data-parallel", "step", "ckpt-00000010-rank1.npz", base / "pristine",
                 {k: base / k for k in ("seed", "topology", "data")}, whole, resume, wrong_dtype)


@pytest.fixture(scope="module")
def ps(tmp_path_factory) -> World:
    base = tmp_path_factory.mktemp("ps")
    digits = load_digits()
    common = dict(model="ssp", momentum=0.9, dtype="float64")
    threads = LocalRunner(5)  # 2 server shards, 3 workers

    def at(name, **kw):
        return PSConfig(checkpoint_every=5, checkpoint_dir=str(base / name), **{**common, **kw})

    whole = async_sgd.train(threads, PSConfig(steps=20, **common), digits, servers=2).params
    async_sgd.train(threads, at("pristine", steps=14), digits, servers=2)
    async_sgd.train(threads, at("momentum", steps=10, momentum=0.5), digits, servers=2)
    async_sgd.train(threads, at("topology", steps=10), digits, servers=2, workers=2)
    async_sgd.train(threads, at("data", steps=10), load_digits(seed=1), servers=2)

    def resume(directory):
        r = async_sgd.train(threads, PSConfig(steps=20, resume=True, checkpoint_every=5,
                                              checkpoint_dir=str(directory), **common), digits,
                            servers=2)
        return r.params, 20 - r.workers[0].steps

    def wrong_dtype(directory):
        run = PSConfig(**common).fingerprint(PSTopology(2, 3), digest((digits.X_train,
                                                                       digits.y_train)))
        good = ShardState.load(directory, 1, 2, run)
        replace(good, params=good.params.astype(np.float32)).save(directory)

    return World("parameter-server", "version", "shard1of2_v10.npz", base / "pristine",
                 {k: base / k for k in ("momentum", "topology", "data")}, whole, resume,
                 wrong_dtype)


@pytest.fixture(params=["dp", "ps"], ids=["data-parallel", "parameter-server"])
def world(request) -> World:
    return request.getfixturevalue(request.param)


# ---- the damage: each returns the reason the fallback warning must give, or None when the ----
# ---- file is this run's and whole, so that the run resumes from it ----------------------------
_OTHER_SETTING = {"data-parallel": "seed", "parameter-server": "momentum"}  # the cases


def _other_run(kind: str):
    def damage(bad: Path, w: World) -> str:
        source = kind if kind in ("topology", "data") else _OTHER_SETTING[w.name]
        shutil.copyfile(w.foreign[source] / w.newest, bad)
        differs = {"seed": r"seed 2 there, 1 here", "momentum": r"momentum 0\.5 there, 0\.9 here",
                   "topology": r"workers 2 there, 3 here", "data": r"data '\w+' there, '\w+' here"}
        return rf"written by a different run: {differs[source]}"
    return damage


def wrong_dtype(bad: Path, w: World) -> str:
    w.wrong_dtype(bad.parent)
    return r"its params is float32\[\d+\] but this run's \w+ 1 needs float64\[\d+\]"


def truncated(bad: Path, w: World) -> str:
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    return r"its last 64 bytes are not a SHA-256 checksum"


def directory(bad: Path, w: World) -> str:
    bad.unlink()
    bad.mkdir()
    (bad / "notes.txt").write_text("someone's notes")
    return r"unreadable \(\[Errno 21\] Is a directory"


def symlink_to_this_runs_file(bad: Path, w: World) -> None:
    elsewhere = bad.parent.parent / "elsewhere.npz"
    bad.rename(elsewhere)
    bad.symlink_to(elsewhere)


def symlink_to_another_runs_file(bad: Path, w: World) -> str:
    bad.unlink()
    bad.symlink_to(w.foreign[_OTHER_SETTING[w.name]] / w.newest)
    return r"written by a different run"


def dangling_symlink(bad: Path, w: World) -> str:
    bad.unlink()
    bad.symlink_to(bad.parent.parent / "gone.npz")
    return r"unreadable \(\[Errno 2\] No such file"


def unreadable(bad: Path, w: World) -> str | None:
    bad.chmod(0)
    if os.geteuid() == 0:  # root reads it anyway: it is this run's and whole
        return None
    return r"unreadable \(\[Errno 13\] Permission denied"


DAMAGE = {
    "another run's file (seed / momentum)": _other_run("seed"),
    "another topology's file (workers)": _other_run("topology"),
    "another data set's file": _other_run("data"),
    "this run's fingerprint, float32 params": wrong_dtype,
    "truncated": truncated,
    "a directory in its place": directory,
    "a symlink to this run's file elsewhere": symlink_to_this_runs_file,
    "a symlink to another run's file": symlink_to_another_runs_file,
    "a dangling symlink": dangling_symlink,
    "unreadable (mode 000)": unreadable,
}


@pytest.mark.slow  # two trainings per case, after the module's eight
@pytest.mark.parametrize("case", DAMAGE)
def test_resume_past_any_damaged_newest_file_ends_where_the_uninterrupted_run_ends(
        tmp_path, world, case):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(world.pristine, ckpt)
    bad = ckpt / world.newest
    reason = DAMAGE[case](bad, world)
    (params, first), fallback, aside = _resume(lambda: world.resume(ckpt))
    np.testing.assert_array_equal(params, world.whole)  # bit for bit, either way
    if reason is None:  # resumed right: from the newest checkpoint, nothing to warn about
        assert first == 10 and not fallback and not aside, (fallback, aside)
        return
    assert first == 5
    assert re.search(rf"{re.escape(world.newest)}: {reason}", fallback), fallback
    assert re.search(rf"Using {world.unit} 5, the newest whose files for all \d", fallback)
    # the resumed run saved its own key 10 in place of the damaged entry (data parallel has
    # deleted it again since: a rank keeps two), which was moved aside and kept, unless it
    # said it was this run's own file for that key
    assert not bad.is_symlink()
    assert not bad.exists() or read(bad)[0]["params"].dtype == np.float64
    kept = bad.with_name(bad.name + ".aside1")
    if case == "this run's fingerprint, float32 params":
        assert not aside and not kept.exists()
        return
    assert re.search(rf"{re.escape(str(bad))} was in the way of a checkpoint save .*renamed it "
                     rf"to {re.escape(kept.name)}", aside), aside
    if case == "a directory in its place":
        assert (kept / "notes.txt").read_text() == "someone's notes"  # no data lost


# ---- saves: nothing that is not this run's is deleted or overwritten ----------------------------
def _series(directory: Path, run="this run") -> Series:
    return Series(directory, "ckpt-{key}-rank{part}.npz", 1, "step", "rank", run)


def _save(series: Series, key: int, keep: int = 2) -> Path:
    return series.save(key, 0, {"x": np.full(3, float(key))}, {}, keep=keep)


def test_a_directory_at_a_saves_name_is_moved_aside_and_kept(tmp_path):
    obstacle = tmp_path / "ckpt-10-rank0.npz"
    obstacle.mkdir()
    (obstacle / "keep.txt").write_text("precious")
    with pytest.warns(CheckpointMovedAsideWarning, match=r"ckpt-10-rank0\.npz was in the way of a "
                      r"checkpoint save \(a directory\): renamed it to ckpt-10-rank0\.npz\.aside1"):
        path = _save(_series(tmp_path), 10)
    assert read(path)[0]["x"].tolist() == [10.0] * 3
    assert (tmp_path / "ckpt-10-rank0.npz.aside1" / "keep.txt").read_text() == "precious"


def test_a_link_at_a_saves_temporary_name_is_never_written_through(tmp_path):
    precious = tmp_path / "precious.bin"
    precious.write_bytes(b"data")
    (tmp_path / "ckpt-10-rank0.npz.tmp").symlink_to(precious)
    with pytest.warns(CheckpointMovedAsideWarning, match=r"a symbolic link where the save writes"):
        _save(_series(tmp_path), 10)
    assert precious.read_bytes() == b"data"
    (tmp_path / "ckpt-20-rank0.npz.tmp").mkdir()  # a directory at the .tmp name, too
    with pytest.warns(CheckpointMovedAsideWarning, match=r"ckpt-20-rank0\.npz\.tmp was in the way"):
        _save(_series(tmp_path), 20)
    assert (tmp_path / "ckpt-20-rank0.npz.tmp.aside1").is_dir()


def test_another_runs_file_under_the_name_a_save_writes_is_kept_aside(tmp_path):
    theirs = _save(_series(tmp_path, run="their run"), 10)
    before = theirs.read_bytes()
    with pytest.warns(CheckpointMovedAsideWarning, match=r"not this run's checkpoint"):
        _save(_series(tmp_path), 10)
    assert (tmp_path / "ckpt-10-rank0.npz.aside1").read_bytes() == before
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # this run's own older file: replaced, no warning
        _save(_series(tmp_path), 10)


def test_rotation_deletes_only_this_runs_older_files_and_keeps_enough_of_them(tmp_path):
    """A foreign file newer than the one saved must neither be deleted nor make the save delete
    this run's previous file (which another part may still need to complete its checkpoint)."""
    ours, theirs = _series(tmp_path), _series(tmp_path, run="their run")
    _save(theirs, 3)
    _save(ours, 5)
    _save(theirs, 50)
    _save(ours, 10)
    _save(ours, 15)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-10-rank0.npz", "ckpt-15-rank0.npz", "ckpt-3-rank0.npz",
                     "ckpt-50-rank0.npz"]
