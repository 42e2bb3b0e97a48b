"""Data-parallel SGD on 1, 2 and 4 engines: per-step compute and communication against
the cost model, in one run.

    .venv/bin/python bench/bench_data_parallel.py [--sizes 64 1024 1024 10] [--steps 40]

Starts a local 4-engine cluster (ZmqComm between engines), fits alpha and beta twice
between engines 0 and 1: from a ping-pong (one direction busy at a time, as chapter 2
does) and from an exchange (both ranks ``sendrecv`` at once, which is what every step of
a ring allreduce does; on a host whose cores also run the engines' I/O threads it costs
more), and gamma from ``a += b`` on an engine. It then trains with ring-allreduce data parallelism on the first N engines
(weak scaling: 32 examples per worker and step). For each N it prints the median step
time split into compute (the slowest rank) and exposed communication (the rank that
waited least), the cost model's prediction of the allreduce from the exchange fit and
from the ping-pong fit, the ratios, and the bare allreduce of the same gradient timed with
``coursekit.collectives.timing.time_collective`` (the collective without training
around it). Target (issue 5): measured communication within 1.5x of the prediction.
"""

from __future__ import annotations

import argparse

import numpy as np


def bare_allreduce(nbytes, n_workers, repeats):
    """Engine side: median seconds of one ring allreduce of nbytes on the first n engines."""
    import numpy as np

    from coursekit.collectives.timing import time_collective
    from coursekit.comm import engine_comm, first_ranks

    comm = first_ranks(engine_comm(), n_workers)
    if comm is None:
        return None
    return float(np.median(time_collective(comm, "allreduce", "ring", nbytes, repeats)))


def link_times(pattern, sizes):
    """Engine side: chapter 7's calibration (``pingpong`` or ``exchange``) on engines 0, 1."""
    from coursekit.comm import engine_comm
    from coursekit.sim import calibrate

    return getattr(calibrate, pattern)(engine_comm(), sizes, repeats=9)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 1024, 1024, 10])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args(argv)

    from coursekit import cluster, costmodel
    from coursekit.comm import setup_comm
    from coursekit.data import make_classification
    from coursekit.nn.layout import n_params
    from coursekit.parallel import dp_experiments as ex
    from coursekit.parallel.data_parallel import DPConfig
    from coursekit.parallel.exchange import predict_comm

    data = make_classification(4096, args.sizes[0], args.sizes[-1], seed=0)
    cfg = DPConfig(sizes=tuple(args.sizes), batch_size=32, epochs=100, max_steps=args.steps,
                   lr=0.01, timeline_steps=1)
    nbytes = n_params(cfg.sizes) * 4
    with cluster.start(n=max(args.workers)) as c:
        setup_comm(c, timeout=30)
        sizes = [64, 4096, 65536, 1 << 20, 4 << 20]
        pingpong = costmodel.fit(np.array(sizes), c.run(link_times, "pingpong", sizes)[0])
        link = costmodel.fit(np.array(sizes), c.run(link_times, "exchange", sizes)[0])
        gamma = float(np.median(c.run(ex.measure_gamma)))
        run = ex.cluster_runner(c, (data.X_train, data.y_train))
        run(cfg, max(args.workers))  # warm-up: Numba kernels loaded on every engine
        sc = ex.scaling(run, cfg, args.workers, link.alpha, link.beta, gamma)
        bare = [next(t for t in c.run(bare_allreduce, nbytes, int(n), 10) if t is not None)
                if n > 1 else 0.0 for n in sc.workers]
    print(f"model {list(cfg.sizes)}: gradient {nbytes / 2**20:.2f} MiB float32, batch 32 per worker")
    for name, f in (("exchange", link), ("ping-pong", pingpong)):
        print(f"{name:>9} fit: alpha {f.alpha * 1e6:.1f} us, 1/beta {f.bandwidth / 1e9:.2f} GB/s")
    print(f"gamma {gamma * 1e12:.0f} ps/B")
    print(f"{'N':>2} {'step ms':>8} {'compute':>8} {'comm':>8} {'pred (exch)':>11} {'ratio':>6} "
          f"{'pred (ping)':>11} {'ratio':>6} {'bare allreduce':>15} {'efficiency':>10}")
    for i, n in enumerate(sc.workers):
        pred = sc.predicted_comm[i]
        ping = predict_comm("allreduce", "ring", int(n), nbytes, pingpong.alpha, pingpong.beta,
                            gamma)
        ratios = [sc.comm[i] / x if x > 0 else float("nan") for x in (pred, ping)]
        print(f"{n:>2} {sc.step[i] * 1e3:8.2f} {sc.compute[i] * 1e3:8.2f} {sc.comm[i] * 1e3:8.2f} "
              f"{pred * 1e3:11.2f} {ratios[0]:6.2f} {ping * 1e3:11.2f} {ratios[1]:6.2f} "
              f"{bare[i] * 1e3:15.2f} {sc.efficiency[i]:10.2f}")


if __name__ == "__main__":
    main()
