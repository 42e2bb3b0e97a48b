"""Two spawned ranks the test itself can kill: each runs ``target(rank, up, down)``, which
binds, reports ("addr", rank, address) on ``up`` and connects with the (addresses, key) it
then gets on ``down``. Used where run_procs cannot serve: a test that SIGKILLs a rank."""

import multiprocessing as mp
from contextlib import contextmanager


@contextmanager
def two_ranks(target, key: bytes):
    """Start both, hand them each other's address and ``key``; yield (procs, up, downs);
    kill whatever is still alive on the way out."""
    ctx = mp.get_context("spawn")
    up, downs = ctx.Queue(), [ctx.Queue(), ctx.Queue()]
    procs = [ctx.Process(target=target, args=(r, up, downs[r]), daemon=True) for r in range(2)]
    try:
        for p in procs:
            p.start()
        addrs = dict(up.get(timeout=60)[1:] for _ in range(2))
        for d in downs:
            d.put(([addrs[0], addrs[1]], key))
        yield procs, up, downs
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
