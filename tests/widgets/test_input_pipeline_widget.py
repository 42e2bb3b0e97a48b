"""The chapter-7 input-pipeline panel drives the experiment headlessly on ThreadComm ranks."""

import pytest

from coursekit.cluster.runner import LocalRunner
from coursekit.widgets.input_pipeline import InputPipelinePanel


def test_panel_runs_the_settings_its_controls_show(digits_f32):
    data = (digits_f32.X_train, digits_f32.y_train)
    panel = InputPipelinePanel(data, batch=8, steps=3, runner=LocalRunner(2))
    panel.read_ms.value, panel.compute_ms.value = 20, 10
    panel.readers.value, panel.depth.value = 1, 2
    panel.run_button.click()
    assert panel.wait(60), "the clicked run did not end"
    r = panel.result
    assert (r.config.read_s, r.config.compute_s, r.config.readers, r.config.depth) == (0.02, 0.01, 1, 2)
    assert r.ranks == 2 and r.serial_steps.shape == (2, 3)
    assert panel.plot.value[:4] == b"\x89PNG"
    assert "without prefetch" in panel.status.value and "max(r / w, c)" in panel.status.value


def test_panel_says_why_a_setting_is_refused(digits_f32):
    panel = InputPipelinePanel((digits_f32.X_train, digits_f32.y_train), steps=2,
                               runner=LocalRunner(2))
    panel.readers.value, panel.depth.value = 4, 2
    assert panel.run() is None
    assert "depth=2 is less than readers=4" in panel.status.value
    with pytest.raises(ValueError, match="depth=1 is less than readers=2"):
        InputPipelinePanel((digits_f32.X_train, digits_f32.y_train), depth=1, runner=LocalRunner(2))
