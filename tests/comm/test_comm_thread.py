"""ThreadComm and run_local: semantics every backend shares (checked here on threads)."""

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import coursekit.comm as comm_mod
from coursekit.comm import (ANY_SOURCE, ANY_TAG, CommError, CommTimeout, Message, ThreadComm,
                            run_local, frames)


def ring_shift(comm, n):
    """Every rank passes an array to the right with sendrecv; returns what it got."""
    x = np.arange(n, dtype=np.float64) + 100 * comm.rank
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    return comm.sendrecv(x, right, source=left)


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_sendrecv_ring_no_deadlock(p):
    got = run_local(ring_shift, p, 1000)
    for r, y in enumerate(got):
        np.testing.assert_array_equal(y, np.arange(1000) + 100 * ((r - 1) % p))


def pairs(comm):
    if comm.rank == 0:
        for i in range(20):
            comm.send(np.array([i]), 1, tag=i % 2)
        return None
    odd = [int(comm.recv(0, tag=1)[0]) for _ in range(10)]  # tag 1 first: overtakes tag 0
    even = [int(comm.recv(0, tag=ANY_TAG)[0]) for _ in range(10)]
    return odd, even


def test_same_pair_same_tag_messages_arrive_in_order():
    odd, even = run_local(pairs, 2)[1]
    assert odd == list(range(1, 20, 2))
    assert even == list(range(0, 20, 2))


def any_source(comm):
    if comm.rank:
        comm.send(np.array([comm.rank]), 0, tag=comm.rank)
        return None
    got = sorted(int(comm.recv(ANY_SOURCE)[0]) for _ in range(comm.size - 1))
    return got


def test_any_source_collects_every_rank():
    assert run_local(any_source, 4)[0] == [1, 2, 3]


@pytest.mark.parametrize("arr", [
    np.array(3.5), np.zeros((0, 4)), np.array([True, False]), np.array([1 + 2j, 3j], np.complex64),
    np.arange(24, dtype=np.uint16).reshape(2, 3, 4), np.arange(5, dtype=np.int8)[::2],
    np.arange(70000, dtype=np.float32)])
def test_dtypes_and_shapes_survive(arr):
    def fn(comm):
        if comm.rank == 0:
            comm.send(arr, 1)
        else:
            return comm.recv()
    got = run_local(fn, 2)[1]
    assert got.dtype == arr.dtype and got.shape == arr.shape and got.flags.writeable
    np.testing.assert_array_equal(got, arr)


def test_send_copies_so_the_sender_may_reuse_its_buffer():
    def fn(comm):
        if comm.rank == 0:
            x = np.ones(4)
            comm.send(x, 1)
            x[:] = -1
            comm.barrier()
        else:
            comm.barrier()
            return comm.recv(0)
    np.testing.assert_array_equal(run_local(fn, 2)[1], np.ones(4))


def test_recv_out_fills_buffer_including_noncontiguous():
    def fn(comm):
        if comm.rank == 0:
            comm.send(np.arange(3.0), 1)
            comm.send(np.arange(3.0) * 2, 1)
            return None
        out = np.zeros(3)
        strided = np.zeros(6)[::2]
        a = comm.recv(0, out=out)
        b = comm.recv(0, out=strided)
        return a is out, out.copy(), b is strided, strided.copy()
    same_a, out, same_b, strided = run_local(fn, 2)[1]
    assert same_a and same_b
    np.testing.assert_array_equal(out, [0, 1, 2])
    np.testing.assert_array_equal(strided, [0, 2, 4])


def test_recv_out_mismatch_is_a_clear_error():
    def fn(comm):
        if comm.rank == 0:
            comm.send(np.arange(3.0), 1)
        else:
            comm.recv(0, out=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"rank 1 of 2.*float64\(3,\) but out is float32\(3,\)"):
        run_local(fn, 2)


@pytest.mark.parametrize("call, exc, msg", [
    (lambda c: c.send([1, 2], 1), TypeError, "NumPy arrays only"),
    (lambda c: c.send(np.ones(1), 2), ValueError, r"dest=2 .*allowed 0..1$"),
    (lambda c: c.send(np.ones(1), -1), ValueError, "dest=-1"),
    (lambda c: c.send(np.ones(1), 1.0), TypeError, "dest must be an int"),
    (lambda c: c.send(np.ones(1), 1, tag=-1), ValueError, "tag=-1 is out of range"),
    (lambda c: c.send(np.ones(1), 1, tag=40000), ValueError, "allowed 0..32767"),
    (lambda c: c.recv(source=7), ValueError, "or ANY_SOURCE"),
    (lambda c: c.recv(tag=-5), ValueError, "or ANY_TAG"),
    (lambda c: c.recv(out=[0.0]), TypeError, "out must be a NumPy array"),
])
def test_bad_arguments(call, exc, msg):
    a, _ = ThreadComm.world(2, timeout=1)
    with pytest.raises(exc, match=msg):
        call(a)


def test_readonly_out_is_rejected():
    a, _ = ThreadComm.world(2, timeout=1)
    out = np.zeros(2)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        a.recv(out=out)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (2.0, TypeError),
                                        (True, TypeError)])
def test_bad_world_size(bad, error):
    with pytest.raises(error, match=r"the number of ranks: a positive int"):
        run_local(lambda c: None, bad)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (float("nan"), ValueError),
                                        ("1", TypeError), (True, TypeError)])
def test_bad_timeout(bad, error):
    with pytest.raises(error, match="timeout.*a positive number of seconds"):
        ThreadComm.world(2, timeout=bad)


def test_timeout_names_rank_peer_tag_and_operation():
    def fn(comm):
        if comm.rank == 1:
            comm.recv(source=0, tag=4)
    t0 = time.monotonic()
    with pytest.raises(CommTimeout, match=r"rank 1: recv\(source=0, tag=4\) timed out after "
                                          r"0.2 s waiting for rank 0"):
        run_local(fn, 2, timeout=0.2)
    assert time.monotonic() - t0 < 3
    assert issubclass(CommTimeout, TimeoutError)


def test_failing_rank_is_reported_and_others_do_not_hang():
    def fn(comm):
        if comm.rank == 2:
            raise ZeroDivisionError("bad step")
        comm.recv(source=2)  # would wait 30 s without the abort
    t0 = time.monotonic()
    with pytest.raises(ZeroDivisionError, match=r"^\[rank 2 of 4\] bad step$"):
        run_local(fn, 4, timeout=30)
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("p", [1, 2, 3, 6])
def test_barrier_waits_for_the_slowest_rank(p):
    def fn(comm):
        if comm.rank == p - 1:
            time.sleep(0.1)
        entered = time.monotonic()
        comm.barrier()
        return entered, time.monotonic()
    times = run_local(fn, p)
    last_entry = max(entered for entered, _ in times)
    assert all(left >= last_entry for _, left in times)


def test_barrier_message_does_not_match_wildcards():
    a, b = ThreadComm.world(2, timeout=0.3)
    a._post(1, np.empty(0, np.uint8), comm_mod.base.BARRIER_TAG, True)  # a barrier "arrives"
    with pytest.raises(CommTimeout):
        b.recv(ANY_SOURCE, ANY_TAG)


def test_trace_records_every_user_message():
    def fn(comm):
        comm.tracing = True
        comm.barrier()
        x = np.zeros(10, np.float32)
        if comm.rank == 0:
            comm.send(x, 1, tag=2)
        else:
            comm.recv(0)
        return comm.trace
    t0, t1 = run_local(fn, 2)
    assert len(t0) == len(t1) == 1  # barrier traffic is not traced
    s, r = t0[0], t1[0]
    assert isinstance(s, Message)
    assert (s.op, s.src, s.dst, s.tag, s.nbytes) == ("send", 0, 1, 2, 40)
    assert (r.op, r.src, r.dst, r.tag, r.nbytes) == ("recv", 0, 1, 2, 40)
    assert s.t_start <= s.t_end and r.t_start <= r.t_end
    assert abs(r.t_end - time.monotonic()) < 60  # the documented clock


def test_verbose_prints_every_send_and_recv(capsys):
    comm_mod.set_verbose(True)
    try:
        run_local(ring_shift, 2, 3)
    finally:
        comm_mod.set_verbose(False)
    lines = sorted(capsys.readouterr().out.splitlines())
    assert len(lines) == 4
    assert lines[0].startswith("[rank 0] recv <- 1 tag=0 float64(3,) 24 B")
    assert lines[1].startswith("[rank 0] send -> 1 tag=0 float64(3,) 24 B")
    comm_mod.VERBOSE = True  # plain assignment works too
    try:
        run_local(ring_shift, 2, 3)
    finally:
        comm_mod.VERBOSE = False
    assert len(capsys.readouterr().out.splitlines()) == 4


def test_closed_comm_refuses_calls():
    a, _ = ThreadComm.world(2)
    a.close()
    with pytest.raises(CommError, match="closed"):
        a.send(np.ones(1), 1)


junk = st.one_of(st.binary(max_size=64),
                 st.builds(lambda tail: frames.MAGIC + tail, st.binary(max_size=60)))


@settings(max_examples=200, deadline=None)
@given(head=junk, payload=st.one_of(st.none(), st.binary(max_size=64)))
def test_fuzzed_frames_raise_commerror_and_receiver_keeps_working(head, payload):
    a, b = ThreadComm.world(2, timeout=1)
    a._world.deliver(1, (head, payload))
    try:
        got = b.recv()
    except CommError as exc:
        assert not isinstance(exc, CommTimeout)
        assert str(exc).startswith("rank 1:")
    else:  # the random bytes happened to form a valid message
        assert isinstance(got, np.ndarray)
    a.send(np.arange(3), 1, tag=5)
    np.testing.assert_array_equal(b.recv(0, tag=5), np.arange(3))


def test_an_interrupted_operation_makes_the_comm_refuse_further_use():
    a, b = ThreadComm.world(2, timeout=5)

    def interrupt(*_):
        raise KeyboardInterrupt
    a._match = interrupt  # as if Ctrl-C arrived while a waited for a message
    with pytest.raises(KeyboardInterrupt):
        a.recv(1, tag=3)
    assert a.interrupted == "recv(source=1, tag=3)"
    b.send(np.ones(2), 0, tag=3)  # the message the interrupted recv was waiting for
    for use in (lambda: a.recv(1, tag=3), lambda: a.send(np.ones(1), 1), a.barrier):
        with pytest.raises(CommError, match=r"interrupted in recv\(source=1, tag=3\).*reset_comm"):
            use()
