"""How fast is the simulator? A 2048-GPU ResNet-50 data-parallel step, and a replay.

    .venv/bin/python bench/bench_sim.py

Prints the best of several runs for: one simulated step at 2048 GPUs per allreduce
algorithm (161 tensors unfused, and 64 MiB fusion), a whole scaling curve (8 .. 2048
GPUs), and the event-level replay of a real 16-rank ring allreduce (per message).
The issue's target: a 2048-worker step in under one second.
"""

import time


from coursekit.sim import Network, replay, resnet50, trace_collective
from coursekit.sim.step import scaling, simulate_step


def best(fn, repeats=7):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    work = resnet50.workload(batch=32)
    net = resnet50.case_study_network(256)
    print(f"{'what':48s} {'seconds':>10s}")
    for algorithm in ("ring", "tree", "hierarchical"):
        for fusion in (0, 64 * 2**20):
            t = best(lambda: simulate_step(work, net, algorithm=algorithm, fusion_bytes=fusion))
            print(f"2048-GPU step, {algorithm:12s} fusion {fusion >> 20:3d} MiB        {t:10.6f}")
    nodes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    t = best(lambda: scaling(resnet50.workload(), net, nodes, algorithm="hierarchical"))
    print(f"{'scaling curve, 9 points (8..2048 GPUs)':48s} {t:10.6f}")
    small = Network(4, 4, 2e-6, 1e-10, 2e-5, 1e-9, nics_per_node=4)
    programs = trace_collective(16, 1 << 20, "ring")
    messages = sum(len(p) for p in programs) // 2
    t = best(lambda: replay(programs, small))
    print(f"{'replay of a 16-rank ring allreduce':48s} {t:10.6f}"
          f"  ({messages} messages, {t / messages * 1e6:.1f} us each)")
    print(f"\n2048-GPU step under one second: {best(lambda: simulate_step(work, net)) < 1.0}")


if __name__ == "__main__":
    main()
