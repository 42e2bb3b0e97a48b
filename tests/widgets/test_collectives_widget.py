"""The chapter-2 panel drives the timing experiment headlessly on ThreadComm ranks."""

import pytest

from coursekit.collectives import ALGORITHMS
from coursekit.costmodel import LinkFit
from coursekit.cluster.runner import LocalRunner
from coursekit.widgets.collectives import CollectivesPanel


def test_panel_runs_and_follows_the_controls():
    panel = CollectivesPanel(link=LinkFit(1e-5, 1e-9), repeats=1, runner=LocalRunner(4))
    panel.collective.value = "bcast"
    assert panel.algorithm.options == ALGORITHMS["bcast"]
    panel.algorithm.value = "scatter_allgather"
    panel.ranks.value = 3
    panel.size.value = 1 << 14
    panel.run_button.click()
    assert panel.wait(60), "the clicked run did not end"
    r = panel.result
    assert (r.collective, r.algorithm, r.p) == ("bcast", "scatter_allgather", 3)
    assert r.nbytes.tolist() == [1 << 10, 1 << 12, 1 << 14]
    assert panel.plot.value[:4] == b"\x89PNG"
    assert "predicted" in panel.status.value


def test_panel_rejects_bad_size():
    with pytest.raises(ValueError, match="max_ranks"):
        CollectivesPanel(max_ranks=0, link=LinkFit(1e-5, 1e-9), runner=LocalRunner(4))


def test_panel_predicts_with_its_link_and_refuses_what_is_not_one():
    from coursekit import costmodel

    panel = CollectivesPanel(link=LinkFit(1e-5, 1e-9), repeats=1, runner=LocalRunner(2))
    panel.size.value = 1 << 12
    panel.run()
    r = panel.result
    assert r.predicted.tolist() == costmodel.predict(r.collective, r.algorithm, 2, r.nbytes,
                                                     1e-5, 1e-9).tolist()
    with pytest.raises(TypeError, match=r"link must have \.alpha"):
        CollectivesPanel(link=(1e-5, 1e-9), runner=LocalRunner(2))
