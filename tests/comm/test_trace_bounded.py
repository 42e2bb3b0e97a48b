"""Every comm's trace stays bounded in a long run.

bench/bench_load.py measured an unbounded trace at ~40 MB per 100k messages per rank.
"""

import pickle

import numpy as np
import pytest

from coursekit.comm import ThreadComm, run_local
from coursekit.comm.procs import run_procs
from coursekit.comm import trace as trace_mod
from coursekit.comm.trace import MAX_MESSAGES, Trace


def test_trace_keeps_the_newest_up_to_maxlen():
    t = Trace(maxlen=8)
    for i in range(100):
        t.append(i)
        assert len(t) <= 8
    assert 6 <= len(t) <= 8
    assert list(t) == list(range(100 - len(t), 100))  # the newest, in order
    assert t.dropped == 100 - len(t) and t.total == 100


def test_every_way_of_adding_is_bounded():
    t = Trace(range(50), maxlen=10)
    assert len(t) <= 10 and t[-1] == 49 and t.total == 50
    t.extend(range(50, 80))
    t += list(range(80, 100))
    t.insert(len(t), 100)
    assert len(t) <= 10 and t[-1] == 100 and t.total == 101
    t[len(t):] = range(101, 130)
    assert len(t) <= 10 and t[-1] == 129 and t.total == 130


def test_since_survives_drops_where_len_marks_do_not():
    t = Trace(maxlen=10)
    t.extend(range(9))
    mark = t.total
    t.extend(range(9, 14))  # drops the oldest ones: indices shift
    assert t.since(mark) == [9, 10, 11, 12, 13]


def test_clear_pickle_and_unbounded():
    t = Trace(range(30), maxlen=16)
    back = pickle.loads(pickle.dumps(t))
    assert type(back) is Trace and back == t
    assert (back.maxlen, back.dropped) == (16, t.dropped)
    t.clear()
    assert len(t) == 0 and t.dropped == 0 and t.total == 0
    u = Trace(maxlen=None)
    u.extend(range(1000))
    assert len(u) == 1000 and u.dropped == 0
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="maxlen"):
            Trace(maxlen=bad)


def test_every_backend_traces_into_a_bounded_trace():
    assert not ThreadComm.world(2)[0].tracing  # off by default, as on ZmqComm and MpiComm
    comm = ThreadComm.world(2, trace=True)[0]
    assert comm.tracing
    assert isinstance(comm.trace, Trace)
    assert comm.trace.maxlen == MAX_MESSAGES
    zmq_comm = run_procs(_trace_kind, 1, timeout=20)[0]
    assert zmq_comm == ("Trace", MAX_MESSAGES)
    assert MAX_MESSAGES is not None and 1_000 <= MAX_MESSAGES <= 1_000_000


def _trace_kind(comm):
    return type(comm.trace).__name__, comm.trace.maxlen


def _chatter(comm, n):
    comm.tracing = True
    x, buf = np.zeros(1, np.float32), np.empty(1, np.float32)
    peer = 1 - comm.rank
    for i in range(n):
        comm.sendrecv(x, peer, source=peer, sendtag=i % 1000, recvtag=i % 1000, out=buf)
    t = comm.trace
    return len(t), t.dropped, t.total, t[-1]


def test_a_long_run_local_keeps_its_trace_bounded(monkeypatch):
    monkeypatch.setattr(trace_mod, "MAX_MESSAGES", 64)
    for length, dropped, total, last in run_local(_chatter, 2, 700):
        assert length <= 64  # an unbounded trace would hold 1400 records here
        assert total == 2 * 700 and dropped == total - length
        assert (last.op, last.tag) == ("recv", 699)  # the newest message is kept
