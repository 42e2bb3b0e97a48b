"""Chapter 09's comparisons as rows (coursekit.production.side_by_side) and their panel."""

import pytest

from coursekit.production.requirement import INSTALL_HINT, torch_available
from coursekit.production.side_by_side import EXPERIMENTS, SideBySide, side_by_side

needs_torch = pytest.mark.skipif(not torch_available(), reason=INSTALL_HINT)


def engines(cluster):
    from coursekit.cluster.runner import ClusterRunner
    from coursekit.comm import setup_comm
    setup_comm(cluster, timeout=30)
    return ClusterRunner(cluster, timeout=300)


def test_a_row_is_equal_only_within_its_tolerance():
    row = SideBySide("x vs y", 2, 1.0, 2.0, 3e3, 4e3, max_error=1e-12, tolerance=1e-12,
                     relative=False)
    assert row.equal and "equal within 1e-12" in row.describe()
    worse = SideBySide("x vs y", 2, 1.0, 2.0, 3e3, 4e3, max_error=2e-12, tolerance=1e-12,
                       relative=True)
    assert not worse.equal and "NOT equal within relative 1e-12" in worse.describe()
    assert "course 3.0 kB, torch 4.0 kB" in worse.describe()


def test_unknown_experiments_and_too_few_workers_are_refused():
    with pytest.raises(ValueError, match="allowed"):
        side_by_side(None, "Horovod vs ring", 2)
    with pytest.raises(ValueError, match="workers"):
        side_by_side(None, next(iter(EXPERIMENTS)), 1)


@needs_torch
@pytest.mark.cluster
def test_fsdp_row_holds_what_zero_3_sends_on_both_sides(cluster2):
    from coursekit.nn.mlp import MLP
    from coursekit.production.zero_fsdp import CHAPTER8

    row = side_by_side(engines(cluster2), "FSDP vs ZeRO-3", 2)
    n = MLP(CHAPTER8["sizes"]).n_params  # 2 ranks: no padding on either side
    assert row.equal and row.max_error <= 1e-12
    assert row.course_bytes == row.library_bytes == pytest.approx(3 * (2 - 1) / 2 * n * 8, rel=1e-12)
    assert row.course_ms > 0 and row.library_ms > 0


@needs_torch
@pytest.mark.cluster
def test_the_panel_runs_the_comparison_its_controls_show_and_keeps_every_run(cluster4):
    from coursekit.comm import setup_comm
    from coursekit.widgets.production import ProductionPanel

    setup_comm(cluster4, timeout=30)
    panel = ProductionPanel(cluster=cluster4, prepare=lambda c: setup_comm(c, timeout=30))
    assert panel.workers.max == 4 and panel.backend.value == "gloo"
    panel.experiment.value, panel.workers.value = "PowerSGD hook vs chapter 6's PowerSGD", 2
    row = panel.run()
    assert row is not None, panel.status.value
    assert (row.experiment, row.workers) == ("PowerSGD hook vs chapter 6's PowerSGD", 2)
    assert row.equal and panel.status.value.startswith("PowerSGD hook vs chapter 6's PowerSGD on 2")
    assert panel.plot.value[:4] == b"\x89PNG"
    panel.experiment.value, panel.workers.value = "pipelining 1F1B vs chapter 5's", 3
    assert panel.run() is None  # 8 layers do not split into 3 stages
    assert "divisors of 8" in panel.status.value
    assert len(panel.results) == 1
