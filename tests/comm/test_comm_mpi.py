"""MpiComm on real MPI ranks: ``mpiexec -n K python tests/comm/test_comm_mpi.py`` under a timeout.

Run as a script, this file is the SPMD program: every rank runs each check and rank 0
prints one JSON line {check: "ok" | error}. Run under pytest, it launches that program.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

mpi4py = pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install '.[mpi]')") \
    if __name__ != "__main__" else None

NPROCS = 3


# ---- the SPMD checks (run on every rank) ---------------------------------------------------
def check_ring(comm):
    from coursekit.comm.examples import ring_exchange
    y = ring_exchange(comm, 5)
    np.testing.assert_array_equal(y, np.arange(5) + 100 * ((comm.rank - 1) % comm.size))


def check_matching(comm):
    from coursekit.comm import ANY_SOURCE
    if comm.rank:
        for i in range(6):
            comm.send(np.full((200, 200), comm.rank * 10.0 + i % 2), 0, tag=i % 2)
        comm.send(np.array([comm.rank]), 0, tag=7)
        return
    for src in range(1, comm.size):  # tag 1 messages overtake tag 0 ones, but not each other
        assert [comm.recv(src, tag=1)[0, 0] for _ in range(3)] == [src * 10 + 1] * 3
    out = np.empty((200, 200))
    for _ in range(3 * (comm.size - 1)):
        assert comm.recv(ANY_SOURCE, tag=0, out=out) is out and out[0, 0] % 10 == 0
    assert sorted(int(comm.recv(tag=7)[0]) for _ in range(comm.size - 1)) == [1, 2]


def check_dtypes(comm):
    arrays = [np.array(2.5), np.zeros((0, 3)), np.array([True, False]),
              np.array([1 + 2j], np.complex64), np.arange(12, dtype=np.float16).reshape(3, 4)]
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for a in arrays:
        got = comm.sendrecv(a, right, source=left)
        assert got.dtype == a.dtype and got.shape == a.shape and got.flags.writeable
        np.testing.assert_array_equal(got, a)


def check_large_symmetric_exchange(comm):
    """8 MB each way: MPI's rendezvous protocol would deadlock a naive Send/Send."""
    peer = comm.rank ^ 1
    if peer >= comm.size:
        return
    x = np.full(1 << 20, comm.rank, np.float64)
    np.testing.assert_array_equal(comm.sendrecv(x, peer, source=peer), peer)
    comm.send(x, peer)  # buffered: both ranks send first, then receive
    x[:] = -1           # and may reuse the buffer at once
    np.testing.assert_array_equal(comm.recv(peer), peer)


def check_large_send_to_a_waiting_receiver(comm):
    """From SYNC_MIN bytes a send to a rank already in recv goes straight from the array
    (no copy); either way the array may be reused the moment send returns."""
    from coursekit.comm.mpi import SYNC_MIN
    n = 4 * SYNC_MIN // 8
    if comm.rank == 0:
        x = np.arange(n, dtype=np.float64)
        time.sleep(0.1)  # rank 1 is in recv by now, usually (both paths must be right)
        comm.send(x, 1, tag=3)
        x[:] = -1
        comm.send(np.arange(n, dtype=np.float64).reshape(4, -1), 1, tag=4)
    elif comm.rank == 1:
        np.testing.assert_array_equal(comm.recv(0, tag=3), np.arange(n))
        out = np.empty((4, n // 4))
        assert comm.recv(0, tag=4, out=out) is out
        np.testing.assert_array_equal(out.ravel(), np.arange(n))


def check_large_send_does_not_wait_for_the_receiver(comm):
    """A plain send returns without waiting for a receiver that is busy (it copies)."""
    from coursekit.comm.mpi import SYNC_MIN
    n = 4 * SYNC_MIN
    if comm.rank == 0:
        t = time.monotonic()
        comm.send(np.ones(n, np.uint8), 1, tag=5)
        took = time.monotonic() - t
        assert took < 0.5, f"send waited {took:.2f} s for a receiver that sleeps 1 s"
    elif comm.rank == 1:
        time.sleep(1.0)
        np.testing.assert_array_equal(comm.recv(0, tag=5), 1)


def check_large_ring_of_plain_sends(comm):
    """Every rank sends to its right neighbour first, then receives: a cycle of waiting
    senders, which must not deadlock."""
    from coursekit.comm.mpi import SYNC_MIN
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    x = np.full(2 * SYNC_MIN, comm.rank, np.uint8)
    comm.send(x, right, tag=6)
    x[:] = 255
    np.testing.assert_array_equal(comm.recv(left, tag=6), left)


def check_timeout(comm):
    from coursekit.comm import CommTimeout
    comm.timeout = 0.3
    try:
        comm.recv(source=(comm.rank + 1) % comm.size, tag=5)
    except CommTimeout as exc:
        want = f"rank {comm.rank}: recv(source={(comm.rank + 1) % comm.size}, tag=5) timed out"
        assert str(exc).startswith(want), exc
    else:
        raise AssertionError("no CommTimeout")
    finally:
        comm.timeout = 5


def check_message_after_a_timeout_is_kept(comm):
    """A recv that timed out leaves nothing posted behind: the message that comes later
    is the next matching recv's (a parameter server polls this way)."""
    from coursekit.comm import CommTimeout
    if comm.rank == 1:
        time.sleep(0.5)
        comm.send(np.array([42.0]), 0, tag=8)
    elif comm.rank == 0:
        comm.timeout = 0.2
        try:
            comm.recv(1, tag=8)
        except CommTimeout:
            pass
        else:
            raise AssertionError("no CommTimeout")
        finally:
            comm.timeout = 5
        assert comm.recv(1, tag=8)[0] == 42.0


def check_oversized_first_part_is_dropped_and_named(comm):
    """A first part longer than any well-formed header (+ inline payload) is dropped with
    a CommError naming its sender; the comm goes on."""
    from coursekit.comm import CommError
    from coursekit.comm.mpi import _FIRST_MAX
    for delay in (0.0, 0.3):  # there before the recv, and coming while it waits
        if comm.rank == 1:
            time.sleep(delay)
            comm._data.Send(bytearray(_FIRST_MAX + 1), 0, 9)
            comm.send(np.array([7]), 0, tag=9)
        elif comm.rank == 0:
            try:
                comm.recv(1, tag=9)
            except CommError as exc:
                assert "dropped a message from rank 1" in str(exc), exc
            else:
                raise AssertionError("no CommError")
            assert comm.recv(1, tag=9)[0] == 7
        comm.barrier()


def check_barrier(comm):
    if comm.rank == comm.size - 1:
        time.sleep(0.2)
    t = time.monotonic()
    comm.barrier()
    assert comm.rank == comm.size - 1 or time.monotonic() - t > 0.1


def check_private_context(comm):
    """The program's own mpi4py traffic never reaches the Comm (and vice versa)."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    req = world.isend("raw", dest=right, tag=0)
    comm.send(np.array([comm.rank]), right, tag=0)
    assert comm.recv(tag=0)[0] == left
    assert world.recv(source=left, tag=0) == "raw"
    req.wait()


def check_trace(comm):
    comm.trace.clear()
    comm.tracing = True
    from coursekit.comm.examples import ring_exchange
    ring_exchange(comm, 10)
    comm.tracing = False
    ops = sorted((m.op, m.src, m.dst, m.nbytes) for m in comm.trace)
    r, p = comm.rank, comm.size
    assert ops == sorted([("send", r, (r + 1) % p, 80), ("recv", (r - 1) % p, r, 80)]), ops


def check_small_sends_with_changing_headers(comm):
    """Back-to-back small sends that differ only in tag, shape (the same array reshaped in
    place), or dtype each carry their own header (MpiComm reuses the last one when it can)."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    a = np.arange(4.0)
    sent = []
    for tag, arr in ((0, a), (1, a), (1, a.reshape(2, 2)), (1, a.astype(np.float32)), (2, a)):
        comm.send(arr, right, tag=tag)
        sent.append((tag, arr.dtype, arr.shape))
    a.shape = (4, 1)  # the very array object sent above, with another shape
    comm.send(a, right, tag=2)
    sent.append((2, a.dtype, (4, 1)))
    comm.trace.clear()
    comm.tracing = True
    got = [comm.recv(left) for _ in sent]
    comm.tracing = False
    assert [(m.tag, x.dtype, x.shape) for m, x in zip(comm.trace, got)] == sent
    for x in got:
        np.testing.assert_array_equal(x.ravel(), np.arange(4.0))


def check_receives_for_many_source_tag_pairs(comm):
    """More (source, tag) pairs than MpiComm keeps persistent receives for (the kept ones
    are freed and made again), each pair in two rounds, received in another order than
    sent: every message arrives intact and the kept receives stay bounded."""
    from coursekit.comm.mpi import _CACHED_RECEIVES
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    tags = range(2 * _CACHED_RECEIVES + 5)
    for turn in range(2):
        for t in tags:
            comm.send(np.array([comm.rank, t, turn]), right, tag=t)
        got = [comm.recv(left, tag=t).tolist() for t in reversed(tags)]
        assert got == [[left, t, turn] for t in reversed(tags)]
        assert 0 < len(comm._receives) <= _CACHED_RECEIVES


def check_one_array_sent_over_and_over_while_nobody_receives(comm):
    """One array changed in place and sent 3000 times before its receiver looks (the
    persistent send's buffer may be rewritten only once MPI is done with it; meanwhile
    sends go by MPI_Isend, in order), then more (dest, tag) pairs than are kept: every
    message arrives with the value it had when it was sent, in order."""
    from coursekit.comm.mpi import _CACHED_SENDS
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    a = np.zeros(2)
    for i in range(3000):
        a[:] = i, comm.rank
        comm.send(a, right, tag=3)
    time.sleep(0.2)
    got = [comm.recv(left, tag=3).tolist() for _ in range(3000)]
    assert got == [[i, left] for i in range(3000)]
    tags = range(10, 10 + 2 * _CACHED_SENDS)
    for t in tags:
        comm.send(np.array([t]), right, tag=t)
    assert [int(comm.recv(left, tag=t)[0]) for t in tags] == list(tags)
    comm.barrier()
    comm._flush()
    assert len(comm._sends) <= _CACHED_SENDS


def check_collectives_equal_mpi_own(comm):
    """Every coursekit collective and algorithm on MpiComm == mpi4py's native collective."""
    from mpi4py import MPI

    from coursekit import collectives as C
    world, p, r = MPI.COMM_WORLD, comm.size, comm.rank
    x = np.arange(6 * p, dtype=np.float64) * (r + 1) - 3 * r  # divisible by p: no v-variants
    ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
    for op, mpi_op in ops.items():
        want = np.empty_like(x)
        world.Allreduce(x, want, op=mpi_op)
        for algorithm in C.ALGORITHMS["allreduce"]:
            np.testing.assert_allclose(C.allreduce(comm, x, op=op, algorithm=algorithm), want,
                                       rtol=1e-12, err_msg=f"allreduce {algorithm} {op}")
        for algorithm in C.ALGORITHMS["reduce"]:
            got = C.reduce(comm, x, root=1, op=op, algorithm=algorithm)
            native = np.empty_like(x) if r == 1 else None
            world.Reduce(x, native, op=mpi_op, root=1)
            if r == 1:
                np.testing.assert_allclose(got, native, rtol=1e-12, err_msg=f"reduce {algorithm}")
        for algorithm in C.ALGORITHMS["reduce_scatter"]:
            native = np.empty(6, np.float64)
            world.Reduce_scatter_block(x, native, op=mpi_op)
            np.testing.assert_allclose(C.reduce_scatter(comm, x, op=op, algorithm=algorithm),
                                       native, rtol=1e-12, err_msg=f"reduce_scatter {algorithm}")
    for algorithm in C.ALGORITHMS["bcast"]:
        native = x.copy()
        world.Bcast(native, root=2 % p)
        np.testing.assert_array_equal(C.bcast(comm, x, root=2 % p, algorithm=algorithm), native)
    for algorithm in C.ALGORITHMS["allgather"]:
        native = np.empty(6 * p * p)
        world.Allgather(x, native)
        np.testing.assert_array_equal(C.allgather(comm, x, algorithm=algorithm), native)
    for algorithm in C.ALGORITHMS["alltoall"]:
        native = np.empty_like(x)
        world.Alltoall(x, native)
        np.testing.assert_array_equal(C.alltoall(comm, x, algorithm=algorithm), native)
    native = np.empty(6 * p * p) if r == 0 else None
    world.Gather(x, native, root=0)
    got = C.gather(comm, x, root=0)
    if r == 0:
        np.testing.assert_array_equal(got, native)
    native = np.empty(6)
    world.Scatter(x if r == 0 else None, native, root=0)
    np.testing.assert_array_equal(C.scatter(comm, x if r == 0 else None, root=0), native)


def check_single_copy_peers(comm):
    assert comm.single_copy_peers == frozenset()  # MPI moves shared memory itself


CHECKS = [check_single_copy_peers, check_collectives_equal_mpi_own, check_ring, check_matching, check_dtypes, check_large_symmetric_exchange,
          check_large_send_to_a_waiting_receiver, check_large_send_does_not_wait_for_the_receiver,
          check_large_ring_of_plain_sends, check_timeout, check_message_after_a_timeout_is_kept,
          check_oversized_first_part_is_dropped_and_named, check_barrier, check_private_context, check_trace,
          check_small_sends_with_changing_headers,
          check_receives_for_many_source_tag_pairs,
          check_one_array_sent_over_and_over_while_nobody_receives]


def spmd_main() -> None:
    from mpi4py import MPI

    from coursekit.comm.mpi import MpiComm
    comm = MpiComm(timeout=5)
    report = {}
    for check in CHECKS:
        try:
            check(comm)
            report[check.__name__] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported to the test
            report[check.__name__] = f"rank {comm.rank}: {type(exc).__name__}: {exc}"
        comm.barrier()
    reports = MPI.COMM_WORLD.gather(report, root=0)
    if comm.rank == 0:
        merged = {name: next((r[name] for r in reports if r[name] != "ok"), "ok")
                  for name in report}
        print(json.dumps(merged), flush=True)
    comm.close()


# ---- the pytest side ----------------------------------------------------------------------
def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


@pytest.fixture(scope="module")
def mpi_report():
    proc = subprocess.Popen([mpiexec(), "-n", str(NPROCS), sys.executable, __file__],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"mpiexec failed ({proc.returncode}):\n{out}\n{err}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.mpi
@pytest.mark.parametrize("check", [c.__name__ for c in CHECKS])
def test_mpicomm_on_real_ranks(mpi_report, check):
    assert mpi_report[check] == "ok", mpi_report[check]


if __name__ == "__main__":
    spmd_main()
