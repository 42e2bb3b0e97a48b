"""Faults and bad input: a dying worker stops the run and names itself; resume from a
checkpoint gives the uninterrupted run's parameters; bad settings get clear errors."""

from dataclasses import replace

import numpy as np
import pytest

from coursekit.parallel.checkpoint import RankState
from coursekit.parallel.data_parallel.buckets import make_buckets, ready_after_layer
from coursekit.parallel import data_parallel
from coursekit.parallel.data_parallel import DPConfig, WorkerCrashed
from coursekit.cluster.runner import LocalRunner, RankFailure

THREADS = LocalRunner(8)


@pytest.fixture(scope="module")
def data(digits_f64):
    return digits_f64.X_train[:200], digits_f64.y_train[:200]


def cfg(**kw):
    return replace(DPConfig(sizes=(64, 16, 10), dtype="float64", batch_size=24, epochs=3, lr=0.1,
                            momentum=0.9, seed=1, publish_interval=0.0), **kw)


@pytest.mark.parametrize("exchange", ["allreduce", "ps", "average"])
def test_resume_after_a_crash_gives_the_uninterrupted_parameters(data, tmp_path, exchange):
    """Crash in epoch 2 (step 13 of 27), checkpoints every 5 steps: resume from step 10."""
    config = cfg(exchange=exchange, average_every=2 if exchange == "average" else 1,
                 checkpoint_dir=str(tmp_path), checkpoint_every=5)
    whole = data_parallel.train(THREADS, replace(config, checkpoint_dir=str(tmp_path / "whole")),
                                data, workers=3)
    with pytest.raises(RankFailure, match=r"rank 2: WorkerCrashed: worker rank 2 crashed at "
                                          r"step 13"):
        data_parallel.train(LocalRunner(8, comm_timeout=5),
                            replace(config, crash_rank=2, crash_step=13), data, workers=3)
    assert RankState.latest(tmp_path, 3) == 10
    resumed = data_parallel.train(THREADS, config, data, workers=3, resume=True)
    assert resumed.first_step == 10
    np.testing.assert_array_equal(resumed.params, whole.params)  # bit for bit
    np.testing.assert_array_equal(resumed.loss, whole.loss[10:])


def test_only_the_last_complete_checkpoints_are_kept(data, tmp_path):
    data_parallel.train(THREADS, cfg(checkpoint_dir=str(tmp_path), checkpoint_every=4),
                        data, workers=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"ckpt-{s:08d}-rank{r}.npz" for s in (20, 24) for r in (0, 1)]
    assert RankState.latest(tmp_path, 2) == 24
    with pytest.raises(ValueError, match=r"no checkpoint in .* has intact files from all 3 ranks "
                                         r"\(files from ranks \[0, 1\]; unusable: "
                                         r"ckpt-00000024-rank2\.npz: missing"):
        RankState.latest(tmp_path, 3)  # rank 2 never wrote


def test_resume_refuses_a_different_run(data, tmp_path):
    data_parallel.train(THREADS, cfg(checkpoint_dir=str(tmp_path), checkpoint_every=4),
                        data, workers=2)
    # the ranks read the checkpoints: RankFailure, with the ranks' ValueError
    with pytest.raises(RankFailure, match="ValueError: no checkpoint in .* has intact files from "
                                          "all 3 ranks"):
        data_parallel.train(THREADS, cfg(checkpoint_dir=str(tmp_path)),
                            data, workers=3, resume=True)
    with pytest.raises(RankFailure, match="ValueError: .*written by a different run"):
        data_parallel.train(THREADS, cfg(checkpoint_dir=str(tmp_path), lr=0.2),
                            data, workers=2, resume=True)
    with pytest.raises(ValueError, match="resume=True needs config.checkpoint_dir"):
        data_parallel.train(THREADS, cfg(), data, workers=2, resume=True)


def test_a_dead_worker_stops_the_others_within_the_timeout(data):
    """The others block in the allreduce; the runner aborts them and names the dead rank."""
    with pytest.raises(RankFailure, match=r"failed on rank 1:\n  rank 1: WorkerCrashed: "
                                          r"worker rank 1 crashed at step 3") as failure:
        data_parallel.train(LocalRunner(8, comm_timeout=2), cfg(crash_rank=1, crash_step=3), data,
                            workers=4)
    assert failure.value.ranks == [1] and isinstance(failure.value.__cause__, WorkerCrashed)


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=0), r"batch_size=0: must be >= 1 \(the global batch, split over the"),
    (dict(bucket_bytes=0), r"bucket_bytes=0: must be >= 1 \(bytes per gradient bucket; None = "
                           r"one piece\)"),
    (dict(bucket_bytes=1, exchange="ps"), r"bucket_bytes applies to exchange='allreduce' only"),
    (dict(lr_rule="exponential"), r"unknown learning-rate rule 'exponential'; allowed: constant, linear, sqrt, linear_warmup"),
    (dict(exchange="gossip"), r"unknown exchange 'gossip'; allowed: allreduce, ps, average"),
    (dict(algorithm="tree"), r"unknown allreduce algorithm 'tree'; allowed: ring, reduce_bcast"),
    (dict(crash_rank=1), r"give both crash_rank and crash_step"),
    (dict(checkpoint_every=3), r"checkpoint_every > 0 needs a checkpoint_dir"),
    (dict(slow_factor=0.5), r"slow_factor=0.5: must be >= 1"),
    (dict(momentum=1.0), r"momentum=1.0: must be in \[0, 1\)"),
    (dict(dtype="int32"), r"dtype='int32' is not supported; allowed: float32, float64"),
])
def test_bad_settings_are_rejected_with_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cfg(**kwargs)


@pytest.mark.parametrize("n, message", [
    (0, r"n_workers=0: must be >= 1 \(the number of workers\)"),
    (-2, r"n_workers=-2: must be >= 1 \(the number of workers\)"),
    (25, r"batch_size=24 is smaller than the number of workers \(25\)"),
])
def test_bad_worker_counts_are_rejected(data, n, message):
    with pytest.raises(ValueError, match=message):
        data_parallel.train(THREADS, cfg(), data, workers=n)


def test_fault_ranks_must_be_workers(data):
    with pytest.raises(ValueError, match=r"straggler_rank=5 is not a worker: allowed 0..3"):
        data_parallel.train(THREADS, cfg(straggler_rank=5, slow_factor=2.0), data, workers=4)


def test_buckets_cover_the_buffer_from_its_end():
    buckets = make_buckets(10, 8, 24)  # 3 float64 per bucket
    assert buckets == [slice(7, 10), slice(4, 7), slice(1, 4), slice(0, 1)]
    # layers start at 0, 5, 8: bucket [7, 10) starts in layer 1, so it is ready once layer 1
    # (computed before layer 0) is done; [4, 7) starts in layer 0; none waits for layer 2 alone
    assert ready_after_layer(buckets, [0, 5, 8]) == [[1, 2, 3], [0], []]
    with pytest.raises(ValueError, match=r"bucket_bytes=0: must be >= 1 \(bytes, e.g. 262144"):
        make_buckets(10, 8, 0)
