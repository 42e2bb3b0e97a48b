"""The chapter-8 panel: controls -> memory per GPU of every ZeRO stage and a step's time."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from coursekit.memory import PRESETS, TrainingSetup, memory_per_gpu  # noqa: E402
from coursekit.widgets.memory import MemoryPanel  # noqa: E402


def test_the_panel_shows_the_formulas_for_its_controls_and_says_whether_it_fits():
    panel = MemoryPanel("gpt-7b-2k", precision="bf16", optimizer="adam", dp=64)
    every_stage, time = panel.result
    model = PRESETS["gpt-7b-2k"]
    for stage, got in enumerate(every_stage):
        assert got == memory_per_gpu(model, TrainingSetup(precision="bf16", optimizer="adam",
                                                          dp=64, stage=stage))
    assert every_stage[0].total > 80e9 > every_stage[3].total  # 16 bytes x 6.6B does not fit
    assert "does NOT fit on a 80 GB GPU" in panel.status.value
    panel.stage.value = 3  # the panel recomputes on every change
    assert panel.status.value.startswith(f"{every_stage[3].total / 1e9:.1f} GB per GPU: fits on")
    before = panel.result[1].communication
    panel.link_gbs.value = 10.0
    assert panel.result[1].communication > before  # a slower link, a longer exchange
    assert panel.plot.value  # a picture


def test_fewer_micro_batches_than_stages_show_a_large_bubble():
    panel = MemoryPanel("gpt2-small")
    panel.micro_batches.value = 1
    panel.pp.value = 4
    assert panel.error is None
    assert panel.result[1].bubble == pytest.approx(3 * panel.result[1].compute)


def text_width_px(text: str, size_px: int = 13) -> float:
    """``text``'s width in DejaVu Sans at JupyterLab's widget font size (13 px): Linux
    browsers' usual sans font, and wider than the Helvetica / Arial / Segoe UI of others."""
    from matplotlib import font_manager, ft2font
    font = ft2font.FT2Font(font_manager.findfont("DejaVu Sans"))
    font.set_size(size_px, 72)  # 72 dpi: one point is one pixel
    font.set_text(text)
    return font.get_width_height()[0] / 64  # 26.6 fixed point


def test_every_label_fits_the_width_it_gets_and_there_is_no_useless_run_button():
    import ipywidgets as widgets

    panel = MemoryPanel()
    controls = [c for column in panel.children[0].children for c in column.children]
    assert len(controls) == 13
    for control in controls:
        label = int(control.style.description_width.removesuffix("px"))
        if isinstance(control, widgets.Checkbox):
            # a 300 px widget: the indent (the label width), the box and its margins (< 40 px)
            # and the description; "recompute activations" (144 px) showed as "recompute activa…"
            room = 300 - label - 40
        else:
            room = label
        assert text_width_px(control.description) <= room, (control.description, room)
    assert text_width_px("recompute activations") > 300 - 140 - 40  # the label that was cut
    # every change recomputes at once (the first test): Run and Stop would do nothing visible
    assert panel.run_button.layout.display == panel.stop_button.layout.display == "none"
