"""The chapter-2 checks pass the reference algorithms and fail plausible wrong answers."""

import numpy as np

from coursekit import collectives as C
from coursekit.comm import ANY_SOURCE
from coursekit.grading.ch02 import check_binomial_bcast, check_ring_allreduce


def ring(comm, x):
    return C.allreduce(comm, x, algorithm="ring", check=False)


def textbook_ring(comm, x):
    """Another chunk assignment (rank r ends with chunk r-1), sending to the left."""
    p, r = comm.size, comm.rank
    chunks = [c.copy() for c in np.array_split(x, p)]
    left, right = (r - 1) % p, (r + 1) % p
    for k in range(p - 1):
        chunks[(r + 1 + k) % p] += comm.sendrecv(chunks[(r + k) % p], left, source=right)
    for k in range(p - 1):
        chunks[(r + k) % p] = comm.sendrecv(chunks[(r - 1 + k) % p], left, source=right)
    return np.concatenate(chunks)


def test_ring_check_accepts_rings():
    assert check_ring_allreduce(ring, quiet=True)
    assert check_ring_allreduce(textbook_ring, quiet=True)


def test_ring_check_rejects_right_answer_wrong_traffic():
    tree = lambda comm, x: C.allreduce(comm, x, algorithm="reduce_bcast", check=False)  # noqa: E731
    result = check_ring_allreduce(tree, quiet=True)
    assert result.status == "fail" and "messages" in result.message


def test_ring_check_rejects_wrong_sums_and_stubs():
    def off_by_one(comm, x):
        return ring(comm, x) + (comm.rank == 1)
    result = check_ring_allreduce(off_by_one, quiet=True)
    assert result.status == "fail" and "rank 1 returned" in result.message

    def stub(comm, x):
        raise NotImplementedError
    assert check_ring_allreduce(stub, quiet=True).status == "todo"


def descending(comm, x, root):
    """MPICH's tree: relative rank v receives from v - lowbit(v), sends to v + lowbit/2, ..."""
    p, v = comm.size, (comm.rank - root) % comm.size
    mask = 1
    while mask < p and not v & mask:
        mask *= 2
    if v:
        x = comm.recv((v - mask + root) % p)
    mask //= 2
    while mask:
        if v + mask < p:
            comm.send(x, (v + mask + root) % p)
        mask //= 2
    return x


def test_bcast_check_accepts_binomial_trees():
    assert check_binomial_bcast(descending, quiet=True)

    def ascending(comm, x, root):
        """Round k: relative ranks v < 2^k send to v + 2^k (another binomial tree)."""
        p, v = comm.size, (comm.rank - root) % comm.size
        k = 1
        while k < p:
            if k <= v < 2 * k:
                x = comm.recv((v - k + root) % p)
            elif v < k and v + k < p:
                comm.send(x, (v + k + root) % p)
            k *= 2
        return x
    assert check_binomial_bcast(ascending, quiet=True)


def test_bcast_check_rejects_linear_and_chain():
    def linear(comm, x, root):
        if comm.rank != root:
            return comm.recv(root)
        for dst in set(range(comm.size)) - {root}:
            comm.send(x, dst)
        return x
    result = check_binomial_bcast(linear, quiet=True)
    assert result.status == "fail" and "ceil(log2 p)" in result.message

    def chain(comm, x, root):
        p, v = comm.size, (comm.rank - root) % comm.size
        if v:
            x = comm.recv(ANY_SOURCE)
        if v + 1 < p:
            comm.send(x, (comm.rank + 1) % p)
        return x
    result = check_binomial_bcast(chain, quiet=True)
    assert result.status == "fail" and "hops" in result.message
