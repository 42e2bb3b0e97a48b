"""warm_up announces itself, compiles on the first run with an empty Numba cache, loads after."""

import os
import subprocess
import sys

import pytest

from coursekit.nn.warmup import NOTICE, WarmUp

PROBE = "from coursekit.nn.warmup import warm_up; r = warm_up(); print(r.compiled); print(r)"


def run_probe(cache_dir) -> list[str]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=300, check=True)
    return done.stdout.strip().splitlines()


@pytest.mark.slow  # compiles every Numba kernel from an empty cache, in a subprocess
def test_first_run_compiles_after_the_notice_and_the_second_loads_from_the_cache(tmp_path):
    first = run_probe(tmp_path)
    assert first[0] == NOTICE  # printed before the wait, not after
    assert int(first[1]) > 0 and "compiled" in first[2]
    second = run_probe(tmp_path)
    assert int(second[1]) == 0 and "cached" in second[2]


def test_the_summary_line_says_what_happened():
    assert str(WarmUp(12.34, 6)) == "Numba kernels ready in 12.3 s (compiled 6 kernel signatures)"
    assert "nothing to compile" in str(WarmUp(0.2, 0))
