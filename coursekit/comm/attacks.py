"""Message-level attacks on the ZmqComms of a cluster, and what the collectives make of them.

A ZmqComm rank listens on a TCP port that any process on its host (or network) can push
frames into. This module is the intruder of ``tests/comm/test_comm_attacks.py`` and
``bench/fault_attacks.py``: it pushes one class of hostile frames (:data:`ATTACKS`) into
the ranks' ports of a cluster whose comm is set up, then runs a few allreduces on the
engines and sorts what every rank got::

    from coursekit import cluster
    from coursekit.comm import setup_comm, attacks
    with cluster.start(n=3) as c:
        setup_comm(c, timeout=3)
        result = attacks.run_attack(c, "random bytes")
        result.verdict          # "exact", "refusing", "wrong" or "unclear"

The contract it checks (README, "Every ZmqComm message carries a MAC"): a collective that
returns, returns the exact sum; where a comm cannot complete one it raises a CommError,
and a comm whose collective broke off refuses every later call until it is rebuilt.
The real frames the replay, truncation and reflection attacks start from are captured on
rank 0 as it sends them to rank 1 (:func:`capture_frames`), i.e. what someone who can
read the wire would have.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from . import frames

ATTACKS = (
    "random bytes",            # the issue's repro: 100 random bytes into rank 1's port
    "random multipart",        # several messages of 1..4 random parts
    "truncated real frame",    # a captured frame with its trailer (or more) cut off
    "replayed real frame",     # captured frames sent again: inline, two-part, single-copy
    "oversized header",        # a well-formed header declaring 2**62 float64 elements
    "flood",                   # FLOOD garbage frames queued before the collectives
    "flood during collectives",  # garbage pushed while the collectives run
    "reflection",              # frames rank 0 sealed for rank 1, sent to ranks 0 and 2
    "forged descriptor",       # a single-copy notice pointing into rank 0's memory
)
"""The attack classes, in the order the bench runs them."""

FLOOD = 2000
"""Frames in a flood."""

CALLS = 3
"""Allreduces run after each attack."""

N = 1000
"""Elements of each rank's allreduce input ``arange(N) * (rank + 1)``."""


# ---- engine side -------------------------------------------------------------------------
class _Recorder:
    """Stands in for a PUSH socket: records each message's parts, then sends them."""

    def __init__(self, sock):
        self.sock, self.messages, self._parts = sock, [], []

    def send(self, data, flags=0, copy=True, track=False):
        import zmq
        self._parts.append(bytes(memoryview(data).cast("B")))
        if not flags & zmq.SNDMORE:
            self.messages.append(self._parts)
            self._parts = []
        return self.sock.send(data, flags, copy=copy, track=track)


def capture_frames(comm, sender: int = 0, receiver: int = 1) -> list | None:
    """Engine side: ``sender`` sends ``receiver`` an inline, a two-part and (by sendrecv) a
    single-copy message over TCP and returns every message it sent, as lists of parts
    (bytes). Where a shared-memory lane joins them, it is set aside for these three.

    ``receiver`` receives them as usual, so the comm stays in step; other ranks do nothing.
    """
    small, large = np.arange(8.0), np.arange(4096.0)           # inline / header + payload
    bulk = np.arange(float(1 << 15))                             # 256 KiB: single copy
    if comm.rank == receiver:
        comm.recv(sender, tag=7)
        comm.recv(sender, tag=7)
        comm.sendrecv(bulk, sender, source=sender, sendtag=7, recvtag=7)
        return None
    if comm.rank != sender:
        return None
    sock = comm._push[receiver]
    comm._push[receiver] = recorder = _Recorder(sock)
    lane = comm._lane_out.pop(receiver, None)  # a shared-memory lane: these go over TCP
    try:
        comm.send(small, receiver, tag=7)
        comm.send(large, receiver, tag=7)
        comm.sendrecv(bulk, receiver, source=receiver, sendtag=7, recvtag=7)
    finally:
        comm._push[receiver] = sock
        if lane is not None:
            comm._lane_out[receiver] = lane
    return recorder.messages


def allreduce_outcomes(comm, calls: int = CALLS, n: int = N) -> list[str]:
    """Engine side: run ``allreduce(arange(n) * (rank + 1))`` ``calls`` times; one outcome each:
    ``"exact"``, ``"wrong: k of n elements differ"`` or ``"ErrorType: message"``."""
    from coursekit.collectives import allreduce
    x = np.arange(float(n)) * (comm.rank + 1)
    expected = np.arange(float(n)) * (comm.size * (comm.size + 1) // 2)
    outcomes = []
    for _ in range(calls):
        try:
            got = allreduce(comm, x)
        except Exception as exc:  # noqa: BLE001 -- sorted by the caller
            outcomes.append(f"{type(exc).__name__}: {exc}")
            continue
        differ = int(np.count_nonzero(got != expected)) if got.shape == expected.shape else n
        outcomes.append("exact" if differ == 0 else f"wrong: {differ} of {n} elements differ")
    return outcomes


def own_address(comm) -> str:
    """Engine side: the address this rank's comm receives on."""
    return comm.addresses[comm.rank]


# ---- the intruder ------------------------------------------------------------------------
def messages_for(attack: str, captured: list, rng: np.random.Generator, pid: int = 1) -> list:
    """The messages of ``attack``: a list of ``(rank, [part, ...])`` to push into that rank's
    port. ``captured``: what :func:`capture_frames` returned on rank 0 (inline, two-part,
    single-copy notice); ``pid``: rank 0's process, for the forged descriptor."""
    def junk(k):
        return rng.bytes(int(k))

    inline, two_part, notice = captured[0], captured[1], captured[-1]
    if attack == "random bytes":
        return [(1, [junk(100)])]
    if attack == "random multipart":
        return [(1, [junk(rng.integers(0, 300)) for _ in range(rng.integers(1, 5))])
                for _ in range(10)]
    if attack == "truncated real frame":
        return [(1, [inline[0][:-cut]]) for cut in (1, 24, len(inline[0]) - 20)] + [
            (1, [two_part[0][:-8], two_part[1]]), (1, [two_part[0], two_part[1][:-8]])]
    if attack == "replayed real frame":
        return [(1, list(message)) for message in captured]
    if attack == "oversized header":
        head = bytearray(frames.encode(np.zeros(1), tag=frames_tag(), source=0))
        head[16:24] = (2**62).to_bytes(8, "little")  # shape (2**62,): 2**65 bytes
        return [(1, [bytes(head), junk(8)]), (1, [bytes(head) + inline[0][-24:], junk(8)])]
    if attack in ("flood", "flood during collectives"):
        return [(1, [junk(rng.integers(1, 200))]) for _ in range(FLOOD)]
    if attack == "reflection":
        return [(dest, list(message)) for dest in (0, 2) for message in (inline, two_part)]
    if attack == "forged descriptor":
        fake = frames.encode_remote(np.zeros(1 << 15), tag=frames_tag(), source=0, pid=pid,
                                    message_id=1)
        return [(1, [fake]), (1, [fake + notice[0][-24:]]),
                (1, [notice[0][:len(fake)] + junk(24)])]
    raise ValueError(f"unknown attack {attack!r}; allowed: {list(ATTACKS)}")


def frames_tag() -> int:
    """The tag of the allreduce's data messages: what a forged frame would want to match."""
    from coursekit.collectives.tags import tag
    return tag("allreduce")


def push(addresses: list[str], messages: list) -> None:
    """Connect a PUSH socket to each target rank's address and send it its messages."""
    import zmq
    ctx = zmq.Context()
    socks = {}
    try:
        for rank, parts in messages:
            if rank not in socks:
                socks[rank] = ctx.socket(zmq.PUSH)
                socks[rank].connect(addresses[rank])
            socks[rank].send_multipart(parts)
    finally:
        for sock in socks.values():
            sock.close(linger=5000)  # delivered before the context ends
        ctx.term()


@dataclass
class AttackResult:
    """What each rank got from each allreduce after ``attack`` (``outcomes[call][rank]``);
    ``frames``: the messages pushed, ``ranks``: the ranks they were pushed to."""

    attack: str
    frames: int
    ranks: list
    outcomes: list

    @property
    def wrong(self) -> int:
        """Results that were returned and are not the exact sum (must be 0)."""
        return sum(o.startswith("wrong") for call in self.outcomes for o in call)

    @property
    def verdict(self) -> str:
        """``exact``: every call exact on every rank; ``refusing``: no wrong result, only
        CommErrors, and the last call refused on every rank without waiting (not a
        timeout); ``wrong``: some rank returned a wrong sum; ``unclear``: anything else
        (still timing out, an error that is not a CommError)."""
        if self.wrong:
            return "wrong"
        if all(o == "exact" for call in self.outcomes for o in call):
            return "exact"
        errors = [o for call in self.outcomes for o in call if o != "exact"]
        comm_errors = all(o.startswith(("CommError", "CommTimeout")) for o in errors)
        refused = all(o.startswith("CommError") for o in self.outcomes[-1])
        return "refusing" if comm_errors and refused else "unclear"


def run_attack(cluster, attack: str, *, seed: int = 0, calls: int = CALLS) -> AttackResult:
    """Push ``attack``'s frames into the engines' comm ports, run ``calls`` allreduces.

    The cluster's comm must be set up (``setup_comm(cluster, timeout=...)``; a short
    timeout keeps a failing run short). It is left as the attack left it: call
    ``reset_comm(cluster)`` before the next attack.
    """
    from coursekit.comm import call_with_comm
    if attack not in ATTACKS:
        raise ValueError(f"unknown attack {attack!r}; allowed: {list(ATTACKS)}")
    addresses = cluster.run(call_with_comm, own_address)
    captured = cluster.run(call_with_comm, capture_frames)[0]
    pid = cluster.run(os.getpid)[0]
    messages = messages_for(attack, captured, np.random.default_rng(seed), pid)
    limit = 30 + 10 * calls * cluster.run(call_with_comm, _timeout)[0]
    if attack.endswith("during collectives"):
        intruder = threading.Thread(target=push, args=(addresses, messages))
        intruder.start()
        try:
            per_rank = cluster.run(call_with_comm, allreduce_outcomes, calls, timeout=limit)
        finally:
            intruder.join()
    else:
        push(addresses, messages)
        per_rank = cluster.run(call_with_comm, allreduce_outcomes, calls, timeout=limit)
    return AttackResult(attack, len(messages), sorted({rank for rank, _ in messages}),
                        [list(call) for call in zip(*per_rank)])


def _timeout(comm) -> float:
    return comm.timeout
