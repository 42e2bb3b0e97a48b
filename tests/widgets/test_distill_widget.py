"""The chapter-6 distillation panel runs the experiment its controls describe, headlessly."""

import matplotlib

matplotlib.use("Agg")

from coursekit.nn.distill import DistillConfig, distill  # noqa: E402
from coursekit.viz.check import figure_problems  # noqa: E402
from coursekit.viz.distill import plot_distillation  # noqa: E402
from coursekit.widgets.distill import DistillationPanel  # noqa: E402

BASE = DistillConfig(teacher=(64, 16, 10), student=(64, 4, 10), epochs=2)


def test_panel_runs_the_settings_its_controls_show_and_keeps_every_run(digits_f64):
    panel = DistillationPanel(digits_f64, base=BASE)
    panel.T.value, panel.alpha.value, panel.width.value, panel.epochs.value = 2.0, 0.5, 6, 3
    panel.run_button.click()
    assert panel.wait(120), "the clicked run did not end"
    (r,) = panel.results
    assert (r.config.T, r.config.alpha, r.config.student, r.config.epochs) == (2.0, 0.5, (64, 6, 10), 3)
    same = distill(r.config, digits_f64)  # the panel adds nothing of its own
    assert (r.alone_accuracy, r.distilled_accuracy) == (same.alone_accuracy, same.distilled_accuracy)
    assert panel.plot.value[:4] == b"\x89PNG"
    assert f"distilled {r.distilled_accuracy:.1%}" in panel.status.value
    assert f"{r.teacher_flops / r.student_flops:.0f}x fewer FLOPs" in panel.status.value
    panel.T.value = 6.0
    panel.run()
    assert [run.config.T for run in panel.results] == [2.0, 6.0]  # both drawn side by side


def test_the_alpha_slider_offers_only_what_the_config_accepts(digits_f64):
    panel = DistillationPanel(digits_f64, base=BASE)
    panel.alpha.value = 0.0  # clamped to the slider's minimum: alpha = 0 is the student alone
    assert panel.alpha.value == panel.alpha.min > 0
    assert panel.config().alpha == panel.alpha.min


def test_the_picture_keeps_the_figure_rules(digits_f64):
    runs = [distill(BASE, digits_f64), distill(DistillConfig(teacher=(64, 16, 10), student=(64, 8, 10),
                                                             T=2.0, alpha=0.5, epochs=2), digits_f64)]
    assert figure_problems(plot_distillation(runs)) == []
