"""Issue 29: ZmqComm copies a single-copy message once, straight into the receiver's ``out``.

A REMOTE (single-copy) message that arrives while its receiver waits for the 'copied'
notice of its own send used to be copied at once into a fresh array, then again into the
``out`` of the ``recv`` that took it: a rank whose peers ran ahead held one such array per
step, and a ring allreduce peaked at ~2x the array against the model's 1.25x. Here three
ranks (threads of this process, which single copy serves as it serves processes) force
that moment, and tracemalloc measures what the receiving rank allocated.
"""

import secrets
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from coursekit.comm import zmq as czmq

N = 1 << 20  # float64: 8 MiB, far above SINGLE_COPY_MIN
DELAY_S = 0.5  # how long rank 1 leaves rank 0's message uncopied


def _connect(n: int):
    eps = [czmq.bind() for _ in range(n)]
    addrs, key = [e.address for e in eps], secrets.token_bytes(32)
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda r: eps[r].connect(r, addrs, key=key, timeout=10), range(n)))


def test_a_single_copy_message_parked_during_a_send_is_copied_once_into_out():
    comms = _connect(3)
    try:
        assert all(len(c.single_copy_peers) == 2 for c in comms)  # CMA works on this host
        x0, y2 = np.full(N, 1.0), np.full(N, 2.0)
        out0, out1 = np.empty(N), np.empty(N)
        small = np.zeros(1)

        def rank0():
            # sends x0 to rank 1 by single copy; rank 1 copies it DELAY_S late, so rank 0
            # waits for its notice while rank 2's single-copy message arrives: parked
            comms[0].sendrecv(x0, 1, source=2, recvtag=1)
            return comms[0].recv(2, tag=2, out=out0)

        def rank1():
            time.sleep(DELAY_S)
            comms[1].recv(0, out=out1)
            comms[1].send(small, 2, tag=3)

        def rank2():
            comms[2].send(small, 0, tag=1)
            comms[2].sendrecv(y2, 0, source=1, sendtag=2, recvtag=3)

        tracemalloc.start()
        try:
            with ThreadPoolExecutor(3) as pool:
                futures = [pool.submit(f) for f in (rank0, rank1, rank2)]
                got = futures[0].result(timeout=30)
                for f in futures[1:]:
                    f.result(timeout=30)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert got is out0 and (out0 == 2.0).all() and (out1 == 1.0).all()
        # before: + one 8 MiB array (the parked copy); now only small objects
        assert peak < y2.nbytes // 8, f"the receive path allocated {peak} bytes at its peak"
    finally:
        for c in comms:
            c.close(linger=0)


def test_a_parked_single_copy_message_that_does_not_fit_out_still_releases_its_sender():
    """Parked unread, the message must still be copied (and its sender told) when the recv
    that takes it refuses it: else the sender's sendrecv would wait out its timeout."""
    comms = _connect(3)
    try:
        big, small = np.arange(N, dtype=np.float64), np.zeros(1)

        def rank0():
            comms[0].send(small, 1, tag=6)
            comms[0].recv(2, tag=9)  # meanwhile rank 1's single-copy message is parked
            with pytest.raises(ValueError, match="shapes and dtypes must match"):
                comms[0].recv(1, tag=5, out=np.empty(N // 2))
            return time.monotonic()

        def rank1():
            comms[1].sendrecv(big, 0, source=0, sendtag=5, recvtag=6)
            return time.monotonic()

        def rank2():
            time.sleep(DELAY_S)  # rank 1's message arrives first
            comms[2].send(small, 0, tag=9)

        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(f) for f in (rank0, rank1, rank2)]
            refused_at, released_at = futures[0].result(timeout=30), futures[1].result(timeout=30)
        assert released_at - refused_at < 5  # not its 10 s timeout
    finally:
        for c in comms:
            c.close(linger=0)
