"""Chapter 8's picture: one stacked bar per ZeRO stage, the chosen one outlined."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from coursekit.memory import PRESETS, TrainingSetup, memory_per_gpu  # noqa: E402
from coursekit.viz import figure_problems  # noqa: E402
from coursekit.viz.memory import CATEGORIES, plot_memory  # noqa: E402


def test_each_stage_stacks_its_parts_and_the_chosen_one_is_outlined_under_the_rules():
    model = PRESETS["resnet50"]
    stages = [memory_per_gpu(model, TrainingSetup(stage=s, dp=8, micro_batch=32)) for s in range(4)]
    fig = plot_memory(stages, 2, 16e9, model.name)
    assert figure_problems(fig, cropped_to_content=False) == []
    ax = fig.axes[0]
    tops = [sum(getattr(stages[s], c) for c in CATEGORIES) / 1e9 for s in range(4)]
    stacked = ax.patches[:4 * len(CATEGORIES)]
    assert [b.get_y() + b.get_height() for b in stacked[-4:]] == pytest.approx(tops)
    outline = ax.patches[-1]
    assert not outline.get_fill() and (outline.get_x() + outline.get_width() / 2, outline.get_height()) == (
        2, pytest.approx(tops[2]))
    assert ax.lines[0].get_ydata()[0] == 16  # the GPU's 16 GB
