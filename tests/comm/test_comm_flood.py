"""A flood of unauthenticated frames into a ZmqComm's port: what it costs and what it cannot do.

Why the PULL socket's RCVHWM stays 0 (unbounded), see coursekit/comm/zmq.py's module doc:
a finite HWM counts messages per connection, not bytes, so it bounds nothing an intruder
who picks the frame size and opens more connections cannot exceed; and on PULL it never
drops but pushes back over TCP, which would make a legit rank's buffered zero-copy send
wait for its receiver. What holds instead, checked here: the queued frames cost memory in
proportion to the bytes the intruder sent (a stated bound per frame), a legit message is
read past them (fair queueing) and collectives stay exact, and a rank that waits in a receive drops them all.
"""

import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import zmq

from coursekit.collectives import allreduce
from coursekit.comm import zmq as czmq

KEY = secrets.token_bytes(32)
FRAMES, FRAME_BYTES = 20_000, 100
PER_FRAME_BOUND = 1024
"""Bytes of RSS one queued 100-byte frame may cost: its bytes, ZeroMQ's message and queue
slot (measured: ~310-360 B per frame for 100k frames), with room for a loaded machine."""


def _settled_rss(proc) -> int:
    """RSS once the I/O thread stopped taking frames (two readings 0.3 s apart within 64 kB)."""
    last = -1 << 40
    while True:
        rss = proc.memory_info().rss
        if abs(rss - last) < 1 << 16:
            return rss
        last = rss
        time.sleep(0.3)


def test_a_flood_costs_memory_bounded_by_its_frames_and_collectives_stay_exact():
    eps = [czmq.bind() for _ in range(2)]
    addrs = [e.address for e in eps]
    with ThreadPoolExecutor(2) as pool:
        # the flood is on the socket; one thread drives both ranks, which a plain send of a
        # large array through a shared-memory lane (a rendezvous) would not allow
        a, b = pool.map(lambda r: eps[r].connect(r, addrs, key=KEY, timeout=60,
                                                 shared_memory=False), range(2))
    ctx = zmq.Context()
    intruder = ctx.socket(zmq.PUSH)
    intruder.setsockopt(zmq.SNDHWM, 0)
    intruder.connect(addrs[1])
    try:
        proc, x = psutil.Process(), np.arange(20000.0)
        a.send(x, 1, tag=1)
        np.testing.assert_array_equal(b.recv(0, tag=1), x)
        rss0 = _settled_rss(proc)
        junk = os.urandom(FRAME_BYTES)
        for _ in range(FRAMES):  # rank 1 is idle (in no call): its I/O thread queues them
            intruder.send(junk)
        time.sleep(0.5)
        grown = _settled_rss(proc) - rss0
        assert grown <= FRAMES * PER_FRAME_BOUND, (grown, grown / FRAMES)

        a.send(x + 1, 1, tag=2)  # read past the queued junk: the result is exact
        np.testing.assert_array_equal(b.recv(0, tag=2), x + 1)
        with ThreadPoolExecutor(2) as pool:  # a collective too, with the junk still queued
            sums = list(pool.map(lambda c: allreduce(c, x * (c.rank + 1)), (a, b)))
        for total in sums:
            np.testing.assert_array_equal(total, 3 * x)

        def late():  # rank 1 waits in a recv meanwhile: it reads and drops every frame
            deadline = time.monotonic() + 120
            while b.rejected < FRAMES and time.monotonic() < deadline:
                time.sleep(0.05)
            a.send(x + 2, 1, tag=3)
        sender = threading.Thread(target=late)
        sender.start()
        np.testing.assert_array_equal(b.recv(0, tag=3), x + 2)
        sender.join()
        assert b.rejected == FRAMES, b.rejected
        assert "failed authentication" in b.last_rejected
    finally:
        intruder.close(0)
        ctx.term()
        for comm in (a, b):
            comm.close(linger=0)
