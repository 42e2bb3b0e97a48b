"""ZmqComm between real OS processes on loopback, its two-phase setup, faults and fuzzing."""

import functools
import os
import re
import secrets
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from coursekit.comm import ANY_SOURCE, CommError, CommTimeout, frames
from coursekit.comm import zmq as czmq
from coursekit.comm import auth
from coursekit.comm.auth import FrameSealer
from coursekit.comm.examples import ping_pong, ring_exchange
from coursekit.comm.procs import run_procs

from spawned import two_ranks

KEY = secrets.token_bytes(32)


def mixed_traffic(comm):
    """Every rank sends rank 0 a large and a small array per tag; rank 0 checks matching."""
    big = np.full((300, 300), comm.rank, np.float32)  # 360 kB: header + zero-copy payload
    if comm.rank:
        for tag in (1, 2):
            comm.send(big + tag, 0, tag=tag)
            comm.send(np.array([comm.rank, tag]), 0, tag=tag)
        comm.barrier()
        return None
    got = {}
    for src in range(1, comm.size):  # tag 2 first: tag-1 traffic must be buffered meanwhile
        got[src, 2] = (comm.recv(src, tag=2), comm.recv(src, tag=2))
    out = np.empty((300, 300), np.float32)
    for _ in range(comm.size - 1):
        arr = comm.recv(ANY_SOURCE, tag=1, out=out).copy()
        src = int(arr[0, 0]) - 1
        got[src, 1] = (arr, comm.recv(src, tag=1))
    comm.barrier()
    return {key: (float(a.mean()), a.flags.writeable, b.tolist()) for key, (a, b) in got.items()}


def test_processes_match_by_source_and_tag_in_order():
    got = run_procs(mixed_traffic, 3, timeout=20)[0]
    for src in (1, 2):
        for tag in (1, 2):
            assert got[src, tag] == (src + tag, True, [src, tag])


@pytest.mark.parametrize("p", [2, 4])
def test_ring_exchange_between_processes(p):
    got = run_procs(ring_exchange, p, 5, timeout=20)
    for r, y in enumerate(got):
        np.testing.assert_array_equal(y, np.arange(5) + 100 * ((r - 1) % p))


def test_ping_pong_between_processes():
    t0, t1 = run_procs(ping_pong, 2, 100_000, 5, timeout=20)
    assert t0 > 0 and t1 > 0


def exchange_with_trace(comm):
    ring_exchange(comm, 1000)
    return comm.trace


def test_traces_use_one_clock_across_processes():
    t0, t1 = run_procs(exchange_with_trace, 2, timeout=20, trace=True)
    sent = next(m for m in t0 if m.op == "send")
    recv = next(m for m in t1 if m.op == "recv")
    assert (sent.src, sent.dst, sent.nbytes) == (recv.src, recv.dst, recv.nbytes) == (0, 1, 8000)
    assert recv.t_end >= sent.t_start  # a message cannot arrive before it was sent
    assert abs(recv.t_end - sent.t_start) < 10


def failing_rank(comm):
    if comm.rank == 1:
        raise KeyError("missing shard")
    return comm.rank


def test_failing_rank_is_reported_with_its_rank():
    with pytest.raises(KeyError, match=r"\[rank 1 of 2\] missing shard"):
        run_procs(failing_rank, 2, timeout=5)


# ---- a dead peer -------------------------------------------------------------------------
def _fault_rank(rank, up, down, lanes):
    ep = czmq.bind()
    up.put(("addr", rank, ep.address))
    addresses, key = down.get(timeout=60)  # KEY differs in each spawned process
    comm = ep.connect(rank, addresses, key=key, timeout=1.5, shared_memory=lanes)
    if rank == 1:
        comm.send(np.arange(4.0), 0)
        comm.recv(0)  # blocks until the test kills this process
        return
    first = comm.recv(1)
    up.put(("first", rank, (first.tolist(), sorted(comm.shared_memory_peers))))
    down.get(timeout=60)  # the parent has killed rank 1
    t0 = time.monotonic()
    try:
        comm.recv(1, tag=0)
    except CommTimeout as exc:
        up.put(("timeout", rank, (type(exc).__name__, str(exc), time.monotonic() - t0)))
    comm.close(linger=0)


@pytest.mark.slow  # processes; over TCP the survivor waits out its 1.5 s timeout
@pytest.mark.parametrize("lanes", [True, False], ids=["lane", "tcp"])
def test_a_killed_peer_is_named_at_once_on_a_lane_and_by_the_timeout_over_tcp(lanes):
    with two_ranks(functools.partial(_fault_rank, lanes=lanes), KEY) as (procs, up, downs):
        first = ("first", 0, ([0.0, 1.0, 2.0, 3.0], [0, 1] if lanes else []))
        assert up.get(timeout=20) == first
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].join(10)
        downs[0].put("go")
        kind, rank, (error, msg, waited) = up.get(timeout=20)
    assert kind == "timeout" and rank == 0
    if lanes:  # the lane's pidfd of rank 1 tells, long before the timeout
        assert error == "PeerGone", msg
        assert ("rank 0: recv(source=1, tag=0) stopped waiting for rank 1 (tag 0): its process "
                "has exited") in msg
        assert waited < 1.4, waited
    else:
        assert error == "CommTimeout", msg
        assert "rank 0: recv(source=1, tag=0) timed out after 1.5 s waiting for rank 1" in msg
        assert 1.4 < waited < 5


# ---- setup errors and foreign frames (in one process) ---------------------------------------
def test_setup_errors_are_clear():
    with pytest.raises(ValueError, match="wildcard"):
        czmq.bind("*")
    with pytest.raises(ValueError, match="cannot bind"):
        czmq.bind("203.0.113.7")  # TEST-NET address: not on this machine
    ep = czmq.bind()
    try:
        with pytest.raises(ValueError, match="rank order"):
            ep.connect(0, ["tcp://127.0.0.1:1", ep.address], key=KEY)
        with pytest.raises(ValueError, match="rank must be in 0..0"):
            ep.connect(3, [ep.address], key=KEY)
        with pytest.raises(TypeError, match="key must be bytes: a secret all ranks share"):
            ep.connect(0, [ep.address], key="hunter2")
        with pytest.raises(ValueError, match="key must have at least 16 bytes, got 7"):
            ep.connect(0, [ep.address], key=b"hunter2")
    finally:
        ep.close()


def connect_all(endpoints, **kw):
    """Connect every endpoint at once (connect is collective: ranks handshake)."""
    addrs = [e.address for e in endpoints]
    with ThreadPoolExecutor(len(endpoints)) as pool:
        return list(pool.map(lambda r: endpoints[r].connect(r, addrs, key=KEY, **kw),
                             range(len(addrs))))


@pytest.fixture(scope="module")
def pair():
    eps = [czmq.bind() for _ in range(2)]
    addrs = [e.address for e in eps]
    comms = connect_all(eps, timeout=2, shared_memory=False)  # the socket is the subject
    ctx = zmq.Context()
    intruder = ctx.socket(zmq.PUSH)
    intruder.connect(addrs[1])
    yield comms, intruder
    intruder.close(0)
    ctx.term()
    for c in comms:
        c.close(linger=0)


parts = st.lists(st.one_of(st.binary(max_size=48),
                           st.builds(lambda t: frames.MAGIC + t, st.binary(max_size=44))),
                 min_size=1, max_size=3)
INJECTED = {"frames": 0}


def assert_dropped(b, why: str, before: int | None = None) -> None:
    """Rank ``b`` reads what is queued and has dropped one frame more than ``before`` (its
    count now, by default), the last for ``why``, and accepted none: a recv that nothing
    real answers times out, naming the frames it dropped."""
    before = b.rejected if before is None else before
    saved = b.timeout
    b.timeout = 0.1
    try:
        with pytest.raises(CommTimeout) as timeout:
            b.recv()  # any source, any tag: an accepted frame would be returned
    finally:
        b.timeout = saved
    assert b.rejected == before + 1, (b.rejected, before)
    assert b.last_rejected.startswith("rank 1: dropped a frame from 127.0.0.1 that failed "
                                      "authentication: "), b.last_rejected
    assert why in b.last_rejected, b.last_rejected
    assert f"this comm has dropped {b.rejected} frame(s) that failed authentication, the " \
           f"last: {b.last_rejected}" in str(timeout.value)


@settings(max_examples=150, deadline=None)
@given(msg=parts)
def test_frames_from_a_process_without_the_key_are_dropped_and_receiver_survives(pair, msg):
    (a, b), intruder = pair
    before = b.rejected
    intruder.send_multipart(msg)
    INJECTED["frames"] += 1
    big = np.arange(20000, dtype=np.float64)  # separate-payload path with the junk queued
    a.send(big, 1, tag=9)
    np.testing.assert_array_equal(b.recv(0, tag=9), big)  # the junk does not break it off
    assert_dropped(b, "", before)  # dropped during that recv or this one


def test_well_formed_frames_forged_with_a_wrong_key_replayed_or_reflected_are_dropped(pair):
    (a, b), intruder = pair
    arr = np.arange(6.0)
    forger = FrameSealer(secrets.token_bytes(32), rank=0, size=2)  # right layout, wrong key
    intruder.send(forger.seal(frames.encode(arr, tag=4, source=0, inline=True), dest=1))
    assert_dropped(b, "its MAC does not match this comm's key")
    # a frame rank 0 really sealed for rank 1, captured and sent twice: the copy is dropped
    sealed = a._sealer.seal(frames.encode(arr, tag=4, source=0, inline=True), dest=1)
    intruder.send(sealed)
    np.testing.assert_array_equal(b.recv(0, tag=4), arr)
    intruder.send(sealed)
    assert_dropped(b, "from rank 0, the next one is")
    assert re.search(r"it is message (\d+) from rank 0, the next one is (?!\1)", b.last_rejected)
    # sealed by rank 0 for rank 0 (itself), delivered to rank 1 instead
    intruder.send(a._sealer.seal(frames.encode(arr, tag=4, source=0, inline=True), dest=0))
    assert_dropped(b, "not sent by one of this comm's ranks (or not to this rank)")
    # longer than any first part a rank sends: refused before it is hashed
    intruder.send(b"\0" * (auth.FRAME_MAX + 1))
    assert_dropped(b, f"is longer than any this comm sends ({auth.FRAME_MAX} bytes)")
    a._sealer._sent[0] -= 1  # rank 0's own stream to itself never saw that frame
    a.send(arr + 1, 1, tag=4)
    np.testing.assert_array_equal(b.recv(0, tag=4), arr + 1)


def test_payload_of_wrong_length_is_rejected(pair):
    """A rank with the key but a bug (frames sealed by rank 0's own sealer)."""
    (a, b), intruder = pair
    header = a._sealer.seal(frames.encode(np.zeros(10000), tag=1, source=0), dest=1)
    intruder.send_multipart([header, b"short"])
    with pytest.raises(CommError, match="payload has 5 bytes"):
        b.recv(0, tag=1)
    header = a._sealer.seal(frames.encode(np.zeros(10000), tag=1, source=0), dest=1)
    intruder.send_multipart([header, b"x" * 80000, b"extra"])
    with pytest.raises(CommError, match="extra parts"):
        b.recv(0, tag=1)
    a.send(np.ones(3), 1, tag=1)
    np.testing.assert_array_equal(b.recv(0, tag=1), np.ones(3))


# ---- single copy between ranks on one host (process_vm_readv) -------------------------------
def big_exchanges(comm):
    """Large sendrecvs around a ring in several dtypes/shapes, into fresh, given and strided outs."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    got = []
    for dtype, shape in ((np.float32, (512, 300)), (np.int64, (70000,)), (np.complex128, (9, 99, 40))):
        def rank_data(r):
            return (np.arange(np.prod(shape)) + 1000 * r).astype(dtype).reshape(shape)
        mine = rank_data(comm.rank)
        fresh = comm.sendrecv(mine, right, source=left)
        given = np.empty(shape, dtype)
        assert comm.sendrecv(mine, right, source=left, out=given) is given
        strided = np.empty(shape[:-1] + (2 * shape[-1],), dtype)[..., ::2]
        comm.sendrecv(mine, right, source=left, out=strided)
        got.append([a.tolist() == b.tolist() for a, b in ((fresh, rank_data(left)),
                                                          (fresh, given), (fresh, strided))])
    return sorted(comm.single_copy_peers), comm._sent, got


@pytest.mark.parametrize("p", [2, 3])
def test_large_sendrecv_between_processes_is_single_copy_and_exact(p):
    for rank, (peers, sent, got) in enumerate(run_procs(big_exchanges, p, timeout=30)):
        assert peers == [r for r in range(p) if r != rank]  # CMA works on this Linux host
        assert sent == 9  # every one of the 9 sendrecvs went by single copy
        assert got == [[True, True, True]] * 3


def test_single_copy_can_be_switched_off_per_rank():
    eps = [czmq.bind() for _ in range(3)]
    addrs = [e.address for e in eps]
    with ThreadPoolExecutor(3) as pool:
        comms = list(pool.map(lambda r: eps[r].connect(r, addrs, key=KEY, timeout=5,
                                                        single_copy=r != 2), range(3)))
    try:
        assert [sorted(c.single_copy_peers) for c in comms] == [[1], [0], []]
        big = np.arange(100000, dtype=np.float64)
        with ThreadPoolExecutor(3) as pool:  # a ring of sendrecvs: 0 -> 1 single copy, rest TCP
            outs = list(pool.map(lambda r: comms[r].sendrecv(big + r, (r + 1) % 3,
                                                             source=(r - 1) % 3), range(3)))
        for r, out in enumerate(outs):
            np.testing.assert_array_equal(out, big + (r - 1) % 3)
        assert [c._sent for c in comms] == [1, 0, 0]
    finally:
        for c in comms:
            c.close(linger=0)


def test_forged_remote_messages_are_dropped_and_receiver_survives(pair):
    (a, b), intruder = pair
    arr = np.zeros(100000)
    intruder.send(frames.encode_remote(arr, tag=3, source=0, pid=1, message_id=77))
    assert_dropped(b, "its MAC does not match")  # without the key
    # with the key (a rank with a bug): the descriptor is still checked
    seal = a._sealer.seal
    intruder.send(seal(frames.encode_remote(arr, tag=3, source=0, pid=1, message_id=77), 1))
    with pytest.raises(CommError, match="points into process 1, not rank 0's process"):
        b.recv(0, tag=3)
    bad = frames.encode_remote(arr, tag=3, source=0, pid=os.getpid(), message_id=78)
    intruder.send(seal(bad[:-16] + frames.DESCRIPTOR.pack(os.getpid(), 8, 78)[8:], 1))  # address 8
    with pytest.raises(CommError, match="could not copy a message out of rank 0's memory"):
        b.recv(0, tag=3)
    a.send(np.ones(3), 1, tag=3)
    np.testing.assert_array_equal(b.recv(0, tag=3), np.ones(3))


def _sendrecv_to_silent_peer(comm):
    if comm.rank == 1:
        comm.send(np.ones(4), 0)
        time.sleep(3)  # alive, but never receives: the single copy never happens
        return None
    comm.timeout = 1.0
    t0 = time.monotonic()
    try:
        comm.sendrecv(np.ones(1 << 17), 1, source=1)  # 1 MiB: above shm.RECORD_MAX
    except CommTimeout as exc:
        return str(exc), time.monotonic() - t0
    return "no timeout", 0.0


@pytest.mark.slow  # processes; the sender waits out its timeout
def test_single_copy_send_times_out_naming_a_peer_that_never_copies():
    msg, waited = run_procs(_sendrecv_to_silent_peer, 2, timeout=20)[0]
    assert "rank 0: send(dest=1, tag=0) timed out after 1 s waiting for rank 1" in msg
    assert 0.9 < waited < 3


def test_a_rank_still_shaking_hands_accepts_single_copy_from_one_that_finished(monkeypatch):
    """Rank 2 is slow to check rank 1: rank 0 finishes connecting first and sends rank 1 a
    REMOTE message while rank 1 still waits for rank 2's verdict."""
    eps = [czmq.bind() for _ in range(3)]
    addrs = [e.address for e in eps]
    who = threading.local()
    probe = czmq._token_readable

    def slow_probe(pid, address, expected):
        if who.rank == 2 and who.probes == 1:  # rank 2's second probe is of rank 1
            time.sleep(0.5)
        who.probes += 1
        return probe(pid, address, expected)

    monkeypatch.setattr(czmq, "_token_readable", slow_probe)
    big = np.arange(100000, dtype=np.float64)

    def rank(r):
        who.rank, who.probes = r, 0
        comm = eps[r].connect(r, addrs, key=KEY, timeout=5)
        try:
            if r == 2:
                return None
            return comm.sendrecv(big + r, 1 - r, source=1 - r)
        finally:
            comm.barrier()
            comm.close(linger=0)

    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(rank, range(3)))
    np.testing.assert_array_equal(got[0], big + 1)
    np.testing.assert_array_equal(got[1], big)
