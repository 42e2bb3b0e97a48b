"""Shared-memory lanes between ZmqComm ranks on one host (coursekit.comm.shm): every Comm
guarantee holds on them, and they leave nothing behind however a rank ends."""

import os
import secrets
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from coursekit.comm import ANY_SOURCE, CommError, CommTimeout, shm, trace
from coursekit.comm import zmq as czmq
from coursekit.comm.procs import run_procs

from spawned import two_ranks

KEY = secrets.token_bytes(32)
pytestmark = pytest.mark.skipif(not shm.supported(), reason="lanes need Linux on x86-64")


def traffic(comm):
    """Every size class (inline, through the ring, single copy), to itself and around a
    ring, by send and sendrecv, more than a ring holds, and matching out of order."""
    r, p = comm.rank, comm.size
    right, left = (r + 1) % p, (r - 1) % p
    checks = []
    for n in (1, 1000, 5000, 60_000, 100_000, 1 << 20):  # 8 B .. 8 MiB of float64 (480 KB:
        # the ring's largest class, wrapping around it; from 800 KB single copy)
        x = np.arange(n, dtype=np.float64) + 1000 * r
        comm.send(x, r, tag=5)
        checks.append(np.array_equal(comm.recv(r, tag=5), x))
        y = comm.sendrecv(x, right, source=left)
        checks.append(np.array_equal(y, np.arange(n) + 1000 * left))
        for dest in range(p):  # every rank sends every other at once: nobody waits forever
            if dest != r:
                comm.send(x + dest, dest, tag=9)
        for src in range(p):
            if src != r:
                checks.append(np.array_equal(comm.recv(src, tag=9), np.arange(n) + 1000 * src + r))
    for i in range(4 * shm.CAPACITY // 800):  # 4 rings' worth of 800-byte messages, unread
        comm.send(np.full(100, i, np.float64), right, tag=11)
    checks.append(all(comm.recv(left, tag=11)[0] == i for i in range(4 * shm.CAPACITY // 800)))
    for tag in (3, 2, 1):  # matched by tag, not by arrival
        comm.send(np.array([tag, r]), right, tag=tag)
    checks.append([comm.recv(left, tag=t).tolist() for t in (1, 2, 3)] ==
                  [[t, left] for t in (1, 2, 3)])
    comm.send(np.array([r]), right, tag=4)
    checks.append(comm.recv(ANY_SOURCE, tag=4).tolist() == [left])
    comm.barrier()
    return sorted(comm.shared_memory_peers), checks


@pytest.mark.parametrize("p", [2, 4])
def test_lanes_carry_every_size_and_match_by_source_and_tag(p):
    for rank, (peers, checks) in enumerate(run_procs(traffic, p, timeout=60)):
        assert peers == list(range(p)), (rank, peers)  # itself and every peer: all on lanes
        assert checks and all(checks), (rank, checks)


def test_lanes_can_be_switched_off_and_tcp_gives_the_same_results():
    for rank, (peers, checks) in enumerate(run_procs(traffic, 2, timeout=60,
                                                     shared_memory=False)):
        assert peers == [] and all(checks), (rank, peers, checks)


def into_every_out(comm):
    """Rank 0 sends small arrays; rank 1 receives each into an ``out`` of another layout:
    C order (its bytes are copied straight in), a strided view, Fortran order, 0-d, empty,
    and dtypes whose buffer format is not a plain number (bool, float16, complex)."""
    sent = [np.arange(12.0).reshape(3, 4), np.arange(24.0).reshape(4, 6)[:, ::2] * 1,
            np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.array(7.5), np.zeros((0, 3)),
            np.array([True, False, True]), np.arange(5, dtype=np.float16),
            np.array([1 + 2j, 3 - 4j], np.complex128)]
    outs = [np.empty((3, 4)), np.empty((4, 6))[:, ::2], np.empty((2, 3), order="F"),
            np.empty(()), np.empty((0, 3)), np.empty(3, bool), np.empty(5, np.float16),
            np.empty(2, np.complex128)]
    if comm.rank == 0:
        for x in sent:
            comm.send(x, 1, tag=2)
        return None
    return [comm.recv(0, tag=2, out=out) is out and np.array_equal(out, x)
            for x, out in zip(sent, outs)]


@pytest.mark.parametrize("lanes", [True, False])
def test_a_message_fills_an_out_of_any_layout(lanes):
    got = run_procs(into_every_out, 2, timeout=30, shared_memory=lanes)[1]
    assert got == [True] * 8


def traced(comm):
    with trace.recording(comm) as messages:
        comm.sendrecv(np.zeros(10), (comm.rank + 1) % comm.size, source=(comm.rank - 1) % comm.size)
        comm.sendrecv(np.zeros(1 << 16), (comm.rank + 1) % comm.size,
                      source=(comm.rank - 1) % comm.size)
        return [(m.op, m.src, m.dst, m.nbytes) for m in messages()]


def test_lanes_are_traced_like_every_transport():
    got = run_procs(traced, 3, timeout=30)
    for r, msgs in enumerate(got):
        right, left = (r + 1) % 3, (r - 1) % 3
        assert msgs == [("send", r, right, 80), ("recv", left, r, 80),
                        ("send", r, right, 1 << 19), ("recv", left, r, 1 << 19)]


def _silent_peer(comm, what):
    """Rank 1 never answers; rank 0 waits for it (recv, or a sendrecv of a large array,
    which waits for its receiver's copy) and reports the error and how long it waited."""
    if comm.rank == 1:
        time.sleep(2.5)
        return None
    comm.timeout = 0.8
    t0 = time.monotonic()
    try:
        if what == "recv":
            comm.recv(1, tag=6)
        else:
            comm.sendrecv(np.ones(1 << 17), 1, source=1, sendtag=6, recvtag=6)
    except CommTimeout as exc:
        return str(exc), time.monotonic() - t0, sorted(comm.shared_memory_peers)
    return "no timeout", 0.0, []


@pytest.mark.parametrize("what", ["recv", "sendrecv"])
def test_a_wait_on_a_lane_times_out_naming_rank_peer_and_tag(what):
    msg, waited, peers = run_procs(_silent_peer, 2, what, timeout=20)[0]
    assert peers == [0, 1]
    assert f"rank 0: {what}(" in msg and "timed out after 0.8 s waiting for rank 1 (tag 6)" in msg
    assert 0.75 < waited < 2.4  # rank 1 answers nothing for 2.5 s


def _interrupted(comm):
    """SIGALRM raises KeyboardInterrupt in rank 0's lane wait: the comm is marked and
    refuses further use."""
    if comm.rank == 1:
        time.sleep(1.5)
        return None

    def interrupt(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        comm.recv(1, tag=2)
    except KeyboardInterrupt:
        pass
    try:
        comm.send(np.ones(1), 1)
    except CommError as exc:
        return comm.interrupted, str(exc)
    return comm.interrupted, "accepted"


def test_an_interrupted_lane_wait_marks_the_comm():
    interrupted, msg = run_procs(_interrupted, 2, timeout=20)[0]
    assert interrupted == "recv(source=1, tag=2)"
    assert "was interrupted in recv(source=1, tag=2)" in msg


# ---- nothing left behind, nobody else's ------------------------------------------------------
def _segment_rank(rank, up, down):
    ep = czmq.bind()
    up.put(("addr", rank, ep.address))
    addresses, key = down.get(timeout=60)
    comm = ep.connect(rank, addresses, key=key, timeout=30)
    comm.sendrecv(np.ones(1 << 16), 1 - rank, source=1 - rank)  # the lanes are in use
    lanes = comm._lanes
    up.put(("lanes", rank, (lanes.name, lanes.segment.fd, lanes.bell_w,
                            sorted(comm.shared_memory_peers))))
    time.sleep(120)  # until the test kills it


def _maps_naming(name: str) -> list:
    """Every process that maps or holds open a file whose name contains ``name``."""
    holders = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                if name in f.read():
                    holders.append(int(pid))
                    continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if name in os.readlink(f"/proc/{pid}/fd/{fd}"):
                    holders.append(int(pid))
                    break
        except OSError:
            continue
    return holders


def _open_as_nobody(path: str, flags: int) -> str:
    """Try to open ``path`` in a child process that dropped to user 'nobody'."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 3
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.close(os.open(path, flags))
            code = 0
        except PermissionError:
            code = 1
        except OSError:
            code = 2
        finally:
            os._exit(code)
    return {0: "opened", 1: "permission denied", 2: "other error", 3: "could not drop"}[
        os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])]


@pytest.mark.slow  # two spawned processes
def test_a_sigkilled_rank_leaves_no_segment_and_segments_are_the_owners_alone():
    shm_before = set(os.listdir("/dev/shm"))
    with two_ranks(_segment_rank, KEY) as (procs, up, _):
        lanes = dict(up.get(timeout=60)[1:] for _ in range(2))
        names = [lanes[r][0] for r in range(2)]
        assert all(lanes[r][3] == [0, 1] for r in range(2)), lanes
        # while they run: each segment is held by both ranks (the check below can fail)
        for name in names:
            assert sorted(_maps_naming(name)) == sorted(p.pid for p in procs), name
        seg = f"/proc/{procs[0].pid}/fd/{lanes[0][1]}"
        assert os.stat(seg).st_mode & 0o777 == 0o600
        if os.getuid() == 0:  # another user can open neither the segment nor the doorbell
            assert _open_as_nobody(seg, os.O_RDWR) == "permission denied"
            assert _open_as_nobody(f"/proc/{procs[0].pid}/fd/{lanes[0][2]}",
                                   os.O_WRONLY | os.O_NONBLOCK) == "permission denied"
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.join(10)
        for name in names:
            assert _maps_naming(name) == [], name
        # nothing named in /dev/shm either (other processes' semaphores come and go there)
        assert not [e for e in set(os.listdir("/dev/shm")) - shm_before if "coursekit" in e]


def test_a_record_that_claims_another_rank_is_refused():
    eps = [czmq.bind() for _ in range(2)]
    addrs = [e.address for e in eps]
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda r: eps[r].connect(r, addrs, key=KEY, timeout=2), range(2))
    try:
        assert a.shared_memory_peers == b.shared_memory_peers == {0, 1}
        from coursekit.comm import frames
        forged = frames.encode(np.ones(2), tag=1, source=1, inline=True)  # rank 1's, on 0's lane
        assert a._lanes.put(1, forged)
        with pytest.raises(CommError, match="rank 0's shared-memory lane: it claims rank 1"):
            b.recv(tag=1)
        a.send(np.ones(3), 1, tag=1)
        np.testing.assert_array_equal(b.recv(0, tag=1), np.ones(3))
    finally:
        for comm in (a, b):
            comm.close(linger=0)


def _pair():
    eps = [czmq.bind() for _ in range(2)]
    addrs = [e.address for e in eps]
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda r: eps[r].connect(r, addrs, key=KEY, timeout=2), range(2))
    assert a.shared_memory_peers == b.shared_memory_peers == {0, 1}
    return a, b


def test_records_read_in_place_are_copied_out_before_their_ring_space_is_reused():
    """Records longer than COPIED_MAX are read in place; what a recv returns, and what it
    keeps for a later recv, must be copies: 40 rounds wrap the 2 MiB ring five times."""
    a, b = _pair()
    n = 4 * shm.COPIED_MAX // 8  # float64: a 64 KiB payload, read in place
    kept = []
    try:
        for i in range(40):
            a.send(np.full(n, 2.0 * i), 1, tag=1)
            a.send(np.full(n, 2.0 * i + 1), 1, tag=2)
            later = b.recv(0, tag=2)  # the tag-1 record is kept for the next recv meanwhile
            kept += [b.recv(0, tag=1), later]
            out = np.empty(n)
            a.send(np.full(n, -1.0), 1, tag=3)
            assert b.recv(0, tag=3, out=out) is out and (out == -1).all()
        assert [(k[0], k[-1]) for k in kept] == [(v, v) for v in np.arange(80.0)]
    finally:
        for comm in (a, b):
            comm.close(linger=0)


def test_close_goes_on_while_a_frame_read_in_place_is_still_referenced():
    a, b = _pair()
    a.send(np.ones(shm.COPIED_MAX), 1, tag=1)
    source, frame = b._lanes.take()  # a view into b's ring, as a traceback may keep one
    assert source == 0 and type(frame) is memoryview
    names = [c._lanes.name for c in (a, b)]
    for comm in (a, b):
        comm.close(linger=0)
    del frame  # the last reference: the ring is unmapped now
    assert all(_maps_naming(n) == [] for n in names)


def test_close_unmaps_and_closes_every_descriptor():
    eps = [czmq.bind() for _ in range(2)]
    addrs = [e.address for e in eps]
    before = len(os.listdir("/proc/self/fd"))
    with ThreadPoolExecutor(2) as pool:
        comms = list(pool.map(lambda r: eps[r].connect(r, addrs, key=KEY, timeout=2), range(2)))
    names = [c._lanes.name for c in comms]
    assert all(_maps_naming(n) == [os.getpid()] for n in names)
    for c in comms:
        c.close(linger=0)
    assert all(_maps_naming(n) == [] for n in names)
    assert len(os.listdir("/proc/self/fd")) <= before


def _busy_receiver(comm):
    """Rank 1 computes (no comm call) for 1.5 s while rank 0 sends it three large arrays
    by plain send: rank 0 must not wait for it (each send is taken back after the grace
    and sent from rank 0's own copy), and rank 1 gets exactly what was sent, in order,
    even though rank 0 overwrote its array after each send."""
    n = 1 << 18  # 2 MiB of float64: above shm.RECORD_MAX, so by single copy
    if comm.rank == 0:
        x = np.zeros(n)
        took = []
        for i in range(3):
            x[:] = i
            t0 = time.monotonic()
            comm.send(x, 1, tag=i)
            took.append(time.monotonic() - t0)
        x[:] = -1  # the sends returned: the array is ours again
        staged = len(comm._staged)
        comm.barrier()  # rank 1 has copied them all by now; their notices come before it
        return took, (staged, len(comm._staged))
    time.sleep(1.5)
    got = [comm.recv(0, tag=i) for i in range(3)]
    comm.barrier()
    return [float(a.min()) for a in got] + [float(a.max()) for a in got]


def _attentive_receiver(comm):
    """Rank 1 waits in recv: rank 0's plain sends go by single copy (nothing staged)."""
    # a loaded machine may keep the woken receiver off a core longer than the 2 ms grace
    # (then staging is right); a receiver in a call claims the array, however long it takes
    shm.CLAIM_GRACE_S = 1.0  # in this spawned rank only
    n = 1 << 18
    if comm.rank == 0:
        for i in range(3):
            comm.send(np.full(n, float(i)), 1, tag=i)
        return len(comm._staged), comm._sent
    return [float(comm.recv(0, tag=i).mean()) for i in range(3)]


def test_a_plain_send_of_a_large_array_never_waits_for_a_busy_receiver():
    (took, staged), got = run_procs(_busy_receiver, 2, timeout=30)
    assert max(took) < 1.0, took  # well under the receiver's 1.5 s of compute
    assert got == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]
    assert staged == (3, 0)  # all three sent from its own copies, all copied by the barrier


def test_a_plain_send_to_a_receiver_in_a_call_is_a_single_copy():
    (staged, sent), got = run_procs(_attentive_receiver, 2, timeout=30)
    assert got == [0.0, 1.0, 2.0]
    assert staged == 0 and sent == 3  # three REMOTE notices, none taken back and re-sent


def resident_bytes_of(name: str) -> int:
    """Resident bytes of this process's mappings of the memfd ``name`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if "-" in line.split(maxsplit=1)[0]:  # a mapping's first line: "start-end perms ..."
                inside = f"memfd:{name}" in line
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


def test_a_lane_is_mapped_in_before_the_first_message():
    """Both mappings of a ring are faulted in when the lane is built, not by the first
    megabyte of messages (page faults made them 200 us slower each)."""
    owner, sender = shm.Lanes(0, 4, senders=[1]), shm.Lanes(1, 4, senders=[0])
    try:
        assert resident_bytes_of(owner.name) >= 2 * shm.CAPACITY  # its own ring and rank 1's
        assert resident_bytes_of(sender.name) >= 2 * shm.CAPACITY
        assert sender.attach(0, owner.offer())
        before = resident_bytes_of(owner.name)  # two mappings of one memfd now
        sender.enable(0)
        assert resident_bytes_of(owner.name) >= before + shm.CAPACITY
    finally:
        owner.close()
        sender.close()


def test_spinning_goes_on_while_it_pays_and_probes_when_it_did_not():
    spinner = shm.Spinner()
    assert spinner.budget() == shm.SPIN_S
    for _ in range(spinner.MAX_CREDIT):
        spinner.slept(5e-3)  # the sender was busy for long: says nothing about cores
    assert spinner.budget() == shm.SPIN_S
    for _ in range(spinner.MAX_CREDIT):
        spinner.slept(50e-6)  # the answer came right after the spin gave up the core
    budgets = [spinner.budget() for _ in range(2 * spinner.PROBE)]
    assert sorted(set(budgets)) == [0.0, spinner.probe_s] and spinner.probe_s > shm.SPIN_S
    assert budgets.count(0.0) == 2 * spinner.PROBE - 2  # one probe in PROBE waits
    spinner.found()  # a probe found its message: spin again
    assert spinner.budget() == shm.SPIN_S


def test_a_comm_with_peers_on_tcp_spins_shorter():
    """A message over TCP needs both ranks' ZeroMQ I/O threads, which a long spin delays."""
    assert (shm.Spinner.for_peers(True).spin_s, shm.Spinner.for_peers(False).spin_s) == (
        shm.SPIN_S, shm.SOCKET_SPIN_S)
    assert shm.SOCKET_SPIN_S < shm.SPIN_S


def test_polls_per_yield_grow_while_nobody_takes_the_core_and_drop_when_somebody_does():
    spinner = shm.Spinner()
    assert len(spinner.polls) == 1  # at first a spinning rank yields after every poll
    grown = []
    for _ in range(6):
        spinner.found()  # a wait whose yields all returned at once
        grown.append(len(spinner.polls))
    assert grown == [2, 4, 8, 16, 16, 16] and shm.MAX_POLLS_PER_YIELD == 16
    spinner.switched()  # a yield gave the core to another process
    assert len(spinner.polls) == 1
    spinner.found(switched=True)  # that wait's message came after the switch: no growth
    assert len(spinner.polls) == 1


def _polls_after_a_ping_pong(comm, switched_yield_s):
    from coursekit.comm.examples import ping_pong
    shm.SWITCHED_YIELD_S = switched_yield_s  # in this spawned rank only
    # what a late yield does is tested apart: here a loaded machine's strangers must not
    # stop the spin, or the waits sleep and the polls never grow
    comm._lanes.others_running = lambda: 0
    ping_pong(comm, 64 << 10, 50, warmup=0)  # each wait outlasts 16 polls: it yields
    return len(comm._spinner.polls)


@pytest.mark.parametrize("switched_yield_s, polls", [(float("inf"), 16), (0.0, 1)])
def test_a_wait_counts_a_yield_that_took_long_as_giving_the_core_away(switched_yield_s, polls):
    """Every yield counted as a switch (threshold 0) keeps a rank yielding after every
    poll; none counted (threshold inf) lets the polls per yield grow to the most."""
    assert run_procs(_polls_after_a_ping_pong, 2, switched_yield_s, timeout=30) == [polls] * 2


def test_a_yield_that_came_back_late_stops_the_spinning_soon():
    """A yield that handed the core to somebody's time slice costs credit: two such waits
    in a row and the rank sleeps at once (a message would wait for that slice)."""
    spinner = shm.Spinner()
    spinner.yielded_late()
    assert spinner.budget() == shm.SPIN_S
    spinner.yielded_late()
    assert spinner.budget() == 0.0
    spinner.found()
    assert spinner.budget() == shm.SPIN_S


def _waits_beside_a_busy_process(comm):
    """Rank 0 shares its core with a process that never sleeps and waits 12 times for
    rank 1, which sends every 20 ms; rank 0's Spinner credit afterwards."""
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[comm.rank % len(cpus)]})
    comm.barrier()
    if comm.rank == 1:
        for _ in range(12):
            time.sleep(0.02)
            comm.send(np.zeros(1), 0, tag=1)
        return None
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # on rank 0's core
    try:
        for _ in range(12):
            comm.recv(1, tag=1)
    finally:
        hog.kill()
        hog.wait()
    return comm._spinner.credit


def test_a_rank_that_yields_to_a_busy_process_stops_spinning():
    """Without the late-yield check the waits keep their credit (each slept for long, which
    says nothing about cores) and every one of them would lose a time slice to the
    busy process before it looks at its message again."""
    credit, _ = run_procs(_waits_beside_a_busy_process, 2, timeout=60)
    assert credit == 0


def test_a_rank_counts_the_peers_that_run_and_not_those_that_sleep_or_idle():
    """A peer counts as running while it spins and for BUSY_AFTER_WAIT_S after a wait (it
    computes between two waits); not once it sleeps, nor long after its last wait (an
    engine idle between cells is no reason to keep spinning)."""
    me, peer = shm.Lanes(0, 2, senders=[1]), shm.Lanes(1, 2, senders=[0])
    try:
        assert me.attach(1, peer.offer())
        assert me.running_peers() == 0  # it never waited
        peer.spinning()
        assert me.running_peers() == 1
        peer.going_to_sleep()
        assert me.running_peers() == 0
        peer.woke_up()
        assert me.running_peers() == 1
        time.sleep(2 * shm.BUSY_AFTER_WAIT_S)
        assert me.running_peers() == 0
        peer.waited()
        assert me.running_peers() == 1
    finally:
        me.close()
        peer.close()


def test_a_process_that_never_sleeps_is_counted_as_a_stranger():
    """/proc/loadavg counts runnable tasks; with a process spinning beside this one and no
    running peer, at least one is a stranger in every look (more on a busy machine)."""
    lanes = shm.Lanes(0, 1, senders=[])
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        looks = [lanes.others_running() for _ in range(50)]
        assert lanes.runnable_tasks() >= 2
    finally:
        hog.kill()
        hog.wait()
        lanes.close()
    assert min(looks) >= 1, looks


def _turns_on_one_core(comm, strangers):
    """Both ranks on one core take turns: each computes 1 ms, then sends to the other, which
    waits meanwhile, its yields handing the core to that turn; ``strangers`` is what
    :meth:`Lanes.others_running` says (the host's real count would make the outcome depend
    on what else runs). Rank 0's Spinner credit afterwards, and how many of its waits
    stopped spinning after a late yield."""
    shm.Lanes.others_running = lambda self: strangers  # in this spawned rank only
    stopped = []
    penalty = shm.Spinner.yielded_late
    shm.Spinner.yielded_late = lambda self: stopped.append(penalty(self))
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    comm.barrier()
    for turn in range(16):
        if comm.rank == turn % 2:
            end = time.perf_counter() + 1e-3
            while time.perf_counter() < end:
                pass
            comm.send(np.zeros(1), 1 - comm.rank, tag=1)
        else:
            comm.recv(1 - comm.rank, tag=1)
    return comm._spinner.credit, len(stopped)


def test_a_late_yield_to_a_peer_keeps_the_rank_spinning():
    """Each wait's yield hands the core to the peer's 1 ms turn (a late yield), after which
    the message is there: spinning paid (in a 4-rank ring on 2 cores a fifth of the waits
    look like this). Counted as a stranger's slice, credit would fall to 0 and every
    message pay a wake-up."""
    (credit, stopped), _ = run_procs(_turns_on_one_core, 2, 0, timeout=60)
    assert stopped == 0 and credit > 0, (stopped, credit)


def test_a_late_yield_while_a_stranger_is_runnable_stops_the_spinning():
    (credit, stopped), _ = run_procs(_turns_on_one_core, 2, 1, timeout=60)
    assert stopped >= 1, credit


def _outlived(comm, how):
    """Rank 1 sends one message and ends (``how``); rank 0 then reads it, waits for more,
    and fills the ring that rank 1 no longer reads."""
    if comm.rank == 1:
        comm.send(np.arange(3.0), 0, tag=1)
        comm.recv(0, tag=0)  # rank 0 saw the lanes up: end now
        if how == "SIGKILL":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(0)
    assert comm.shared_memory_peers == {0, 1}
    comm.send(np.zeros(1), 1, tag=0)
    time.sleep(1.0)  # rank 1 is gone by now
    got = comm.recv(1, tag=1).tolist()  # what it sent before it ended is not lost
    errors = []
    for wait in (lambda: comm.recv(1, tag=2),
                 lambda: [comm.send(np.zeros(8000), 1, tag=3) for _ in range(40)]):  # > 1 MiB
        t0 = time.monotonic()
        with pytest.raises(CommTimeout) as caught:
            wait()
        errors.append((type(caught.value).__name__, str(caught.value), time.monotonic() - t0))
    return got, errors


@pytest.mark.slow  # two spawned processes
@pytest.mark.parametrize("how", ["exit", "SIGKILL"])
def test_a_lane_peer_that_ended_is_named_at_once_not_after_the_timeout(how):
    got, errors = run_procs(_outlived, 2, how, timeout=60, may_die=(1,))[0]
    assert got == [0.0, 1.0, 2.0]
    (recv_kind, recv_error, recv_s), (send_kind, send_error, send_s) = errors
    assert recv_kind == send_kind == "PeerGone"  # a CommTimeout, raised long before 60 s
    gone = "stopped waiting for rank 1 ({}): its process has exited"
    assert "rank 0: recv(source=1, tag=2) " + gone.format("tag 2") in recv_error
    assert "rank 0: send(dest=1, tag=3) " + gone.format("tag 3") in send_error
    assert recv_s < 5 * shm.PEER_CHECK_S and send_s < 5 * shm.PEER_CHECK_S, (recv_s, send_s)
