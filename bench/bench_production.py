"""Chapter 9's comparisons side by side: the course's step beside torch.distributed's.

    .venv/bin/python bench/bench_production.py [--ranks 2 4] [--only NAME ...]

Starts one local cluster of max(--ranks) engines and runs every comparison of
:data:`coursekit.production.side_by_side.EXPERIMENTS` (DDP, ZeroRedundancyOptimizer, FSDP
as ZeRO-2 and ZeRO-3, torch's GPipe and 1F1B, DDP's PowerSGD hook) on the first p of
them, through the same function chapter 9's panel calls. Prints, per row: whether both
sides agreed after every step (within the comparison's tolerance), the median time of a
step on the slowest rank on each side and their ratio, and the bytes one rank sends per
step on each side. Torch runs gloo on CPU float64 tensors, as the course computes.
"""

from __future__ import annotations

import argparse

from coursekit.production.side_by_side import EXPERIMENTS


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--only", nargs="+", choices=list(EXPERIMENTS), default=list(EXPERIMENTS))
    args = parser.parse_args()

    from coursekit import cluster
    from coursekit.cluster.runner import ClusterRunner
    from coursekit.comm import setup_comm
    from coursekit.production.side_by_side import side_by_side

    print(f"{'comparison':<40}{'p':>3}{'equal':>7}{'course ms':>11}{'torch ms':>10}"
          f"{'torch/course':>14}{'course kB':>11}{'torch kB':>10}")
    with cluster.start(n=max(args.ranks)) as c:
        setup_comm(c, timeout=60)
        runner = ClusterRunner(c, timeout=1800)
        for name in args.only:
            for p in args.ranks:
                row = side_by_side(runner, name, p)
                assert row.equal, row.describe()
                print(f"{name:<40}{p:>3}{'yes':>7}{row.course_ms:>11.2f}{row.library_ms:>10.2f}"
                      f"{row.library_ms / row.course_ms:>13.2f}x{row.course_bytes / 1e3:>11.1f}"
                      f"{row.library_bytes / 1e3:>10.1f}")


if __name__ == "__main__":
    main()
