"""Fault injection on real local clusters: hostile frames, an interrupted client, a killed
engine. Each case asserts a clear error within a bounded time that names the cause, no
process left behind, and that the next experiment computes the right answer.

Other faults are tested where their feature lives: a rank killed mid-recv between plain
processes (test_comm_zmq), a killed data-parallel engine (test_data_parallel_cluster), a
killed parameter-server worker (test_param_server_cluster), a killed engine or controller
under a panel (test_panel), a SIGKILLed kernel that owns a cluster (test_reaper), corrupt
and half-written checkpoints (test_checkpoint_integrity).
"""

import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest
import zmq
from ipyparallel import interactive  # ship the engine functions by value

from coursekit import cluster
from coursekit.cluster import EngineError
from coursekit.comm import call_with_comm, reset_comm, setup_comm

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def four():
    with cluster.start(n=4) as c:
        setup_comm(c, timeout=5)
        yield c


@interactive
def _expect_refusal(comm, tag):
    """Rank 1 waits (0.5 s) for a message that only the intruder sends: how does it end?"""
    from coursekit.comm import CommError, CommTimeout
    if comm.rank != 1:
        return None
    saved, comm.timeout = comm.timeout, 0.5
    try:
        got = comm.recv(0, tag=tag)
    except CommTimeout as exc:
        return "timeout", str(exc), comm.rejected
    except CommError as exc:
        return "refused", str(exc), comm.rejected
    finally:
        comm.timeout = saved
    return "accepted", repr(got), comm.rejected


@interactive
def _exchange(comm, tag):
    import numpy as np
    if comm.rank == 0:
        comm.send(np.arange(5.0), 1, tag=tag)
    return comm.recv(0, tag=tag).tolist() if comm.rank == 1 else None


def _forged_frames():
    """Frames an intruder without the comm's key might push, by name."""
    from coursekit.comm import frames
    from coursekit.comm.auth import FrameSealer
    header = frames.encode(np.zeros(4), tag=7, source=0, inline=True)
    wrong_key = FrameSealer(os.urandom(32), rank=0, size=4)
    huge = bytearray(frames.encode(np.zeros(1), tag=7, source=0))
    huge[16:24] = (2**62).to_bytes(8, "little")  # declares a 2**62-element array
    return {
        "garbage": [os.urandom(37)],
        "well-formed, unsealed": [header],
        "internal tag": [frames.encode(np.zeros(1), tag=40000, source=0, inline=True)],
        "huge declared size": [bytes(huge), b"x" * 8],
        "forged single-copy descriptor": [frames.encode_remote(np.zeros(1 << 16), tag=7,
                                                               source=0, pid=1, message_id=1)],
        "sealed with a wrong key": [wrong_key.seal(header, dest=1)],
    }


def test_frames_injected_into_an_engines_port_are_dropped_naming_the_sender(four):
    address = four.run(call_with_comm, _own_address)[1]
    ctx = zmq.Context()
    intruder = ctx.socket(zmq.PUSH)
    intruder.connect(address)
    accepted = 0
    try:
        for count, (name, parts) in enumerate(_forged_frames().items(), 1):
            intruder.send_multipart(parts)
            outcome, message, rejected = four.run(call_with_comm, _expect_refusal, 7,
                                                  timeout=30)[1]
            accepted += outcome == "accepted"
            # dropped where it was read; the recv waited on for a real message, and its
            # timeout names what it dropped
            assert outcome == "timeout" and rejected == count, (name, outcome, message)
            assert (f"this comm has dropped {count} frame(s) that failed authentication, the "
                    "last: rank 1: dropped a frame from 127.0.0.1 that failed authentication"
                    ) in message, (name, message)
            # the comm lives on: the next message between the ranks arrives intact
            assert four.run(call_with_comm, _exchange, 7, timeout=30)[1] == list(np.arange(5.0))
    finally:
        intruder.close(0)
        ctx.term()
    assert accepted == 0


@interactive
def _own_address(comm):
    return comm.addresses[comm.rank]


@interactive
def _allreduce_forever(comm):
    import numpy as np

    from coursekit.collectives import allreduce
    x = np.ones(1 << 16) * comm.rank
    while True:
        allreduce(comm, x, algorithm="ring")


@interactive
def _allreduce_once(comm):
    import numpy as np

    from coursekit.collectives import allreduce
    return allreduce(comm, np.full(1000, comm.rank + 1.0), algorithm="ring")[:3].tolist()


def test_an_interrupted_client_frees_the_engines_and_a_reset_comm_is_clean(four):
    # Python's own SIGINT handler, as in a kernel: a shell that starts this run in the
    # background hands it SIGINT ignored (bash does that without job control)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            four.run(call_with_comm, _allreduce_forever, timeout=60)
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - t0 < 15  # the engines were interrupted, not waited for
    assert len(four.run(os.getpid, timeout=5)) == 4  # free for the next cell at once
    # the interrupted collective may have left messages in flight: the comm refuses use
    with pytest.raises(EngineError, match=r"was interrupted in .*reset_comm\(cluster\)"):
        four.run(call_with_comm, _allreduce_once, timeout=30)
    reset_comm(four)
    assert four.run(call_with_comm, _allreduce_once, timeout=30) == [[10.0] * 3] * 4


@interactive
def _pipeline_forever(comm):
    import numpy as np

    from coursekit.nn import MLP
    from coursekit.parallel.pipeline import execute, schedule
    mlp = MLP([16, 32, 32, 10], dtype=np.float64, seed=0)  # 3 layers, one per rank
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((64, 16)), rng.integers(0, 10, 64)
    while True:
        execute(comm, schedule("1f1b", comm.size, 8), mlp, X, y)


@pytest.mark.parametrize("work", [_allreduce_forever, _pipeline_forever],
                         ids=["allreduce", "pipeline"])
def test_an_engine_killed_mid_run_is_named_and_nothing_is_left(work):
    with cluster.start(n=3) as c:
        setup_comm(c, timeout=3)
        pids = c.run(os.getpid)
        processes = [psutil.Process(pid) for pid in pids]
        launched = time.monotonic()
        killer = threading.Timer(1.5, os.kill, (pids[1], signal.SIGKILL))
        killer.start()
        with pytest.raises(EngineError) as failure:
            c.run(call_with_comm, work, timeout=60)
        killer.join()
        waited = time.monotonic() - launched
        assert waited < 30, waited  # the comm timeout (3 s), not the run's 60 s
        message = str(failure.value)
        assert "rank 1: its engine process died while running the task" in message, message
        assert "waiting for rank 1" in message, message  # the survivors name the dead one
    time.sleep(0.5)
    assert not [p.pid for p in processes if p.is_running() and p.status() != "zombie"]
    with cluster.start(n=2) as again:  # the next experiment
        setup_comm(again, timeout=5)
        assert again.run(call_with_comm, _allreduce_once, timeout=30) == [[3.0] * 3] * 2


def test_a_local_cluster_listens_on_loopback_only(four):
    """Controller, schedulers, engines and their comms: no port another host can reach."""
    controller = psutil.Process(four.ipp_cluster.controller.process.pid)
    processes = [controller, *controller.children(recursive=True),
                 *(psutil.Process(pid) for pid in four.run(os.getpid))]
    listening = [(p.pid, c.laddr.ip, c.laddr.port) for p in processes
                 for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert len(listening) >= 4 + 5, listening  # a comm port per engine + the controller's
    assert {ip for _, ip, _ in listening} == {"127.0.0.1"}, listening
