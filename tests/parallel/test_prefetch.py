"""The prefetching loader: same batches in the same order, bounded read-ahead, real overlap,
a reader's error raised in the caller, and no thread left behind."""

import threading
import time

import numpy as np
import pytest

from coursekit.parallel.prefetch import PrefetchLoader


def reader_threads() -> list:
    return [t for t in threading.enumerate() if t.name.startswith("prefetch-reader")]


def jittery_read(key):
    """Reads finish out of order: later keys are often faster."""
    time.sleep(float(np.random.default_rng(key).uniform(0, 0.004)))
    return key * key


@pytest.mark.parametrize("readers, depth", [(0, 1), (1, 1), (1, 3), (3, 3), (4, 8)])
def test_every_batch_once_in_the_order_of_the_keys(readers, depth):
    keys = list(range(40))
    with PrefetchLoader(jittery_read, keys, readers=readers, depth=depth) as loader:
        got = list(loader)
    assert got == [k * k for k in keys]  # the serial loop's batches, none lost or repeated
    assert loader.alive == 0 and not reader_threads()


def test_read_ahead_never_exceeds_depth():
    taken, ahead = [0], []
    lock = threading.Lock()

    def read(key):
        with lock:
            ahead.append(key - taken[0])  # batches started beyond the last one taken
        time.sleep(0.001)
        return key

    with PrefetchLoader(read, range(30), readers=3, depth=3) as loader:
        for batch in loader:
            time.sleep(0.003)  # a slow consumer: the readers fill the queue and wait
            with lock:
                taken[0] = batch + 1
    assert max(ahead) <= 3, ahead  # key - taken < depth while the caller holds batch taken-1


def test_the_next_read_runs_while_the_caller_computes():
    """Overlap shown by events, not timings: batch 1 starts reading while batch 0 is in use."""
    started = {k: threading.Event() for k in range(3)}

    def read(key):
        started[key].set()
        return key

    with PrefetchLoader(read, range(3), readers=1, depth=2) as loader:
        for batch in loader:
            if batch == 0:  # "compute" on batch 0 without asking for batch 1
                assert started[1].wait(5), "batch 1 was not read ahead"
    serial_started = {k: threading.Event() for k in range(3)}
    with PrefetchLoader(lambda k: serial_started[k].set() or k, range(3), readers=0, depth=1) as loader:
        for batch in loader:
            if batch == 0:
                assert not serial_started[1].is_set()  # readers=0: no read ahead


def test_a_readers_error_reaches_the_caller_after_the_batches_before_it():
    def read(key):
        if key == 5:
            raise OSError("disk gone")
        return key

    got = []
    loader = PrefetchLoader(read, range(10), readers=2, depth=2)
    with pytest.raises(RuntimeError, match=r"reading batch 5 \(key 5\) failed: OSError: disk gone") as info:
        for batch in loader:
            got.append(batch)
    assert got == [0, 1, 2, 3, 4]
    assert isinstance(info.value.__cause__, OSError)
    assert loader.alive == 0 and not reader_threads()


def test_break_and_close_stop_the_readers_even_when_they_wait_for_a_slot():
    with PrefetchLoader(lambda k: k, range(1000), readers=4, depth=4) as loader:
        for batch in loader:
            if batch == 2:
                break
    assert loader.alive == 0 and not reader_threads()
    loader = PrefetchLoader(lambda k: k, range(1000), readers=2, depth=2)
    time.sleep(0.05)  # the readers filled the queue and now wait for the caller
    loader.close()
    assert loader.alive == 0
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(loader))


def test_close_reports_a_reader_stuck_in_read():
    release = threading.Event()
    loader = PrefetchLoader(lambda k: release.wait(10), range(3), readers=1, depth=1,
                            close_timeout=0.05)
    time.sleep(0.02)
    with pytest.raises(RuntimeError, match="prefetch-reader-0 is still inside read"):
        loader.close()
    release.set()
    loader.close()
    assert loader.alive == 0


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(readers=-1), ValueError, r"readers=-1: must be >= 0"),
    (dict(readers=1.5), TypeError, "readers must be an integer"),
    (dict(readers=True), TypeError, "readers must be an integer"),
    (dict(depth=0), ValueError, r"depth=0: must be >= 1"),
    (dict(readers=3, depth=2), ValueError, r"depth=2 is less than readers=3"),
    (dict(close_timeout=0), ValueError, "close_timeout"),
])
def test_bad_settings_are_refused_before_any_thread_starts(kwargs, error, match):
    with pytest.raises(error, match=match):
        PrefetchLoader(lambda k: k, range(3), **kwargs)
    assert not reader_threads()


def test_read_must_be_a_function():
    with pytest.raises(TypeError, match="read must be a function read"):
        PrefetchLoader("disk", range(3))
