"""A prefetching loader: background readers fill a bounded queue while the caller computes.

The ResNet-50 case study's first technique is its **input pipeline**: the next batches are
read and preprocessed while the GPU computes on the current one. With a read of ``r``
seconds per batch, ``w`` readers working at once and a compute of ``c`` seconds per step,
a step costs

    serial (no prefetch):       t = r + c
    overlapped (prefetch):      t = max(r / w, c)      (once the queue has filled)

so the reading disappears behind the compute as soon as ``w >= r / c`` readers keep up.

:class:`PrefetchLoader` yields ``read(key)`` for every key, **in the order of the keys**,
whatever order its readers finish in: prefetching changes when a batch is read, never
which batches a step sees. ``readers=0`` reads in the caller's thread (the serial loop, the
reference). The readers are **threads**: they overlap with the caller's work only where
that work or the read itself releases Python's GIL (waiting on a disk, a socket or
``time.sleep``; NumPy's large array operations). A reader that computes in pure Python
needs processes instead (PyTorch's ``DataLoader(num_workers=...)``).

The queue is bounded: at most ``depth`` batches are read or being read ahead of the one
the caller holds, so memory stays at ``depth`` batches however slow the caller is. An
exception in a reader is raised in the caller when it reaches that batch (the batches
before it arrive first). The loader stops its threads when the last batch is taken, when
the caller's loop raises or breaks out of a ``with`` block, and on :meth:`close`: no
thread is left behind.
"""

from __future__ import annotations

import threading

from coursekit import checks

__all__ = ["PrefetchLoader", "check_depth"]


def check_depth(readers: int, depth: int) -> None:
    """A ValueError unless ``depth >= readers``: a reader needs a free slot to read into."""
    if depth < readers:
        raise ValueError(f"depth={depth} is less than readers={readers}: each reader needs a "
                         "free slot to read into, so depth must be at least readers")


class PrefetchLoader:
    """Iterate over ``read(key)`` for ``key`` in ``keys``, read by ``readers`` background
    threads at most ``depth`` batches ahead (``readers=0``: read on demand, no overlap).

    Use it as a context manager (``with PrefetchLoader(...) as loader: for batch in
    loader: ...``) or iterate it to the end; :meth:`close` stops the readers at once.
    ``close_timeout``: seconds :meth:`close` waits for a reader that is still inside
    ``read`` (a RuntimeError names it if it does not come back).
    """

    def __init__(self, read, keys, *, readers: int = 2, depth: int = 4,
                 close_timeout: float = 30.0):
        if not callable(read):
            raise TypeError(f"read must be a function read(key) that returns the batch for that "
                            f"key; got {type(read).__name__} {read!r:.60}")
        self._keys = list(keys)
        self.readers = checks.integer(readers, "readers", at_least=0,
                                      hint=" (background reader threads; 0 reads in the caller)")
        self.depth = checks.integer(depth, "depth", at_least=1,
                                    hint=" (batches read ahead of the one in use)")
        check_depth(self.readers, self.depth)
        self.close_timeout = checks.real(close_timeout, "close_timeout", above=0,
                                         hint=" (seconds)")
        self._read = read
        self._cond = threading.Condition()
        self._ready: dict[int, object] = {}  # index -> batch read, not yet taken
        self._failed: dict[int, BaseException] = {}  # index -> what its read raised
        self._claimed = 0   # indices handed to readers so far
        self._taken = 0     # batches the caller has taken
        self._closed = False
        self._threads = [threading.Thread(target=self._reader, name=f"prefetch-reader-{i}",
                                          daemon=True) for i in range(self.readers)]
        for thread in self._threads:
            thread.start()

    def __len__(self) -> int:
        return len(self._keys)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self):
        try:
            while self._taken < len(self._keys):
                yield self._next()
        finally:  # the end, a break out of the caller's loop, or an exception
            self.close()

    # ---- the caller's side -----------------------------------------------------------------

    def _next(self):
        i = self._taken
        if not self._threads:  # readers=0: the serial loop
            if self._closed:
                raise RuntimeError("the loader is closed")
            batch = self._read(self._keys[i])
            self._taken += 1
            return batch
        with self._cond:
            while i not in self._ready and i not in self._failed and not self._closed:
                self._cond.wait()
            if self._closed:
                raise RuntimeError("the loader is closed")
            self._taken += 1
            self._cond.notify_all()  # a slot is free: a reader may read ahead
            if i in self._failed:
                err = self._failed.pop(i)
                raise RuntimeError(f"reading batch {i} (key {self._keys[i]!r:.60}) failed: "
                                   f"{type(err).__name__}: {err}") from err
            return self._ready.pop(i)

    def close(self) -> None:
        """Stop the readers and wait for them (a read in progress is finished first)."""
        with self._cond:
            self._closed = True
            self._ready.clear()
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(self.close_timeout)
            if thread.is_alive():
                raise RuntimeError(f"{thread.name} is still inside read() after "
                                   f"{self.close_timeout:g} s; it will end when read returns")

    @property
    def alive(self) -> int:
        """Reader threads still running."""
        return sum(thread.is_alive() for thread in self._threads)

    # ---- a reader ----------------------------------------------------------------------------

    def _reader(self) -> None:
        n = len(self._keys)
        while True:
            with self._cond:
                while (not self._closed and self._claimed < n
                       and self._claimed - self._taken >= self.depth):
                    self._cond.wait()
                if self._closed or self._claimed >= n:
                    return
                i = self._claimed
                self._claimed += 1
            try:
                batch = self._read(self._keys[i])
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                with self._cond:
                    self._failed[i] = err
                    self._cond.notify_all()
                return
            with self._cond:
                if not self._closed:
                    self._ready[i] = batch
                self._cond.notify_all()
