"""MPI's own collectives beside the course's on the same MPI engines (chapter 9, section 1).

    .venv/bin/python bench/bench_mpi_collectives.py [--sizes 1024 1048576 16777216]
                                                     [--ranks 2 4] [--repeats 5]

Starts one cluster of max(--ranks) MPI engines (``cluster.start(engines="mpi")``) and runs
the chapter's experiment, :func:`coursekit.production.mpi_collectives.experiment`, on the
first p of them for each p: mpi4py's ``Allreduce``, ``Bcast``, ``Allgather`` and
``Reduce_scatter_block`` beside the course's algorithms over MpiComm and over ZmqComm,
every course result checked equal to MPI's. Prints busbw (GB/s; median over repeats of
the slowest rank's call) and each course implementation's busbw as a fraction of MPI's.

``bench_allreduce.py`` measures ring allreduce against ``MPI_Allreduce`` in plain
``mpiexec`` processes (issue 4's targets); this bench goes through ipyparallel engines as
the notebook does, for the four collectives and every algorithm the chapter shows.
"""

from __future__ import annotations

import argparse

from coursekit.production.mpi_collectives import MpiCollectivesConfig

DEFAULT = MpiCollectivesConfig()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT.sizes))
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=DEFAULT.repeats)
    args = parser.parse_args()
    config = MpiCollectivesConfig(sizes=tuple(args.sizes), repeats=args.repeats)

    from coursekit import cluster
    from coursekit.cluster.runner import ClusterRunner
    from coursekit.comm import setup_comm
    from coursekit.production.mpi_collectives import experiment
    from coursekit.viz import byte_label

    with cluster.start(n=max(args.ranks), engines="mpi") as c:
        setup_comm(c, timeout=120)
        runner = ClusterRunner(c, timeout=1800)
        for p in args.ranks:
            result = experiment(runner, config, workers=p)
            assert result.equal, "a course result differs from MPI's"
            print(result.table())
            print(f"{'':<47}" + "".join(f"{byte_label(n):>11}" for n in result.nbytes)
                  + "   (busbw / MPI's)")
            for collective in config.collectives:
                mpi, *course = result.of(collective)
                for m in course:
                    print(f"{collective:<15}{m.label:<32}"
                          + "".join(f"{r:>10.2f}x" for r in m.busbw / mpi.busbw))
            print(f"(every course result equal to MPI's; {result.library})\n")


if __name__ == "__main__":
    main()
