"""Message-level attacks on a 3-engine cluster's comm: is every collective exact or refused?

    python bench/fault_attacks.py              # every attack class once (~1 min when fixed)
    python bench/fault_attacks.py --rounds 3   # each class 3 times, different random frames

For each class of :data:`coursekit.comm.attacks.ATTACKS` (random bytes, random
multipart, truncated / replayed / reflected real frames, a header declaring 2**62
elements, floods, a forged single-copy descriptor) it pushes the frames into the ranks'
comm ports (``setup_comm(c, timeout=3)``), runs three ``allreduce(arange(1000) *
(rank + 1))`` on the engines and sorts the result (``AttackResult.verdict``): exact,
refusing (the comm raises a CommError for every call after the one that broke off),
wrong (a rank returned a wrong sum) or unclear. The comm is rebuilt (``reset_comm``)
between attacks. Issue 29 asks for: wrong results 0, every comm exact or refusing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coursekit import cluster  # noqa: E402
from coursekit.comm import attacks, reset_comm, setup_comm  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="runs of each attack class")
    parser.add_argument("--timeout", type=float, default=3.0, help="the comm's timeout (s)")
    args = parser.parse_args()
    results = []
    with cluster.start(n=3) as c:
        setup_comm(c, timeout=args.timeout)
        for rnd in range(args.rounds):
            for attack in attacks.ATTACKS:
                t0 = time.monotonic()
                result = attacks.run_attack(c, attack, seed=rnd)
                took = time.monotonic() - t0
                results.append(result)
                print(f"{attack:26s} {result.frames:5d} messages  {result.verdict:9s} "
                      f"wrong {result.wrong}  {took:5.1f} s", flush=True)
                for i, call in enumerate(result.outcomes):
                    if any(o != "exact" for o in call):
                        for rank, outcome in enumerate(call):
                            print(f"    call {i + 1} rank {rank}: {outcome[:150]}")
                reset_comm(c)
    verdicts = [r.verdict for r in results]
    print(f"\nattacks tried: {len(results)}; comm left exact: {verdicts.count('exact')}, "
          f"refusing: {verdicts.count('refusing')}; wrong results: "
          f"{sum(r.wrong for r in results)}; unclear: {verdicts.count('unclear')}")
    return 0 if all(v in ("exact", "refusing") for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
