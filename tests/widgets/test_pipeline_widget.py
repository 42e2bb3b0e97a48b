"""The chapter-5 panel, driven headlessly: controls -> simulated bubble and memory."""

import pytest

from coursekit.widgets.pipeline import PipelinePanel


def test_panel_shows_closed_form_bubble_and_memory():
    panel = PipelinePanel("gpipe", stages=4, microbatches=8)
    assert panel.result.bubble_fraction == pytest.approx(3 / 11)
    assert list(panel.result.peak_activations) == [8] * 4
    assert panel.plot.value[:8] == b"\x89PNG\r\n\x1a\n"
    panel.name.value = "1f1b"
    assert list(panel.result.peak_activations) == [4, 3, 2, 1]
    assert "bubble 27.3%" in panel.status.value


@pytest.mark.slow  # four schedules simulated, each drawn and checked
def test_panel_chunks_and_zero_bubble():
    panel = PipelinePanel("interleaved_1f1b", stages=4, microbatches=8)
    panel.t_w.value = 0.0
    panel.chunks.value = 2
    assert panel.result.bubble_fraction == pytest.approx(3 / 19)  # (p-1)/(vm+p-1)
    panel.t_w.value = 1.0
    panel.name.value = "zb_h1"  # chunks are ignored outside interleaved
    assert panel.result.bubble_fraction == pytest.approx(3 / 27)  # (p-1)/(3m+p-1)


def test_panel_reports_impossible_settings():
    panel = PipelinePanel("1f1b", stages=4, microbatches=8)
    assert bytes(panel.plot.value)[:4] == b"\x89PNG"
    panel.microbatches.value = 2
    assert panel.result is None
    assert bytes(panel.plot.value) == b""  # no picture of the previous setting under the error
    assert panel.status.value.startswith("error:") and "microbatches >= stages" in panel.status.value
