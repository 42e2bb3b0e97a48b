"""The figure rules (coursekit.viz.check): each rule catches what it names, and nothing else."""

import io

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from coursekit.viz import (FigureStyleError, figure_problems, integer_ticks, legend_outside,  # noqa: E402
                          readable_log_ticks, show)
from coursekit.viz.check import enforce, png  # noqa: E402


def good_figure(width=6.0, height=3.0):
    fig = Figure(figsize=(width, height), layout="constrained")
    ax = fig.subplots()
    x = np.arange(1, 9)
    ax.plot(x, x**2, "o-", color="C0", label="ring")
    ax.plot(x, 2 * x, "o-", color="C1", label="tree")
    ax.set(xlabel="workers", ylabel="time [ms]", title="good")
    integer_ticks(ax)
    legend_outside(ax)
    return fig, ax


def test_a_figure_that_keeps_every_rule_has_no_problem():
    fig, _ = good_figure()
    assert figure_problems(fig) == []


def test_too_large_for_a_laptop_screen():
    fig, _ = good_figure(width=13, height=8)
    assert figure_problems(fig) == ["figure is 13 x 8 in; at most 10 x 7.5 in fits a laptop screen"]


def test_fonts_outside_the_vocabulary():
    fig, ax = good_figure()
    ax.set_title("huge", fontsize=20)
    ax.text(1, 1, "tiny", fontsize=5)
    problems = figure_problems(fig)
    assert len(problems) == 2 and "texts are 5 pt (e.g. 'tiny')" in problems[0] and "20 pt" in problems[1]


def test_a_legend_over_the_data():
    fig, ax = good_figure()
    ax.legend(loc="center")
    ax.plot([4.5], [30], "s", label="_hidden")  # a point right under the centred legend
    assert any("the legend covers" in p for p in figure_problems(fig))


def test_a_legend_over_bars():
    fig = Figure(figsize=(6, 3), layout="constrained")
    ax = fig.subplots()
    ax.bar([0, 1, 2], [5, 5, 5], label="compute")
    ax.set_ylim(0, 5.2)
    ax.legend(loc="upper center")
    assert any("the legend covers 1 data points" in p for p in figure_problems(fig))


def test_two_methods_with_one_look():
    fig, ax = good_figure()
    ax.lines[1].set_color("C0")
    assert figure_problems(fig) == ["axes 'good': 'ring' and 'tree' share one colour (and line style)"]
    ax.lines[1].set_linestyle("--")  # same colour, other style: measured vs model of one method
    assert figure_problems(fig) == []


def test_a_counting_axis_with_fractional_ticks():
    fig, ax = good_figure()
    ax.set_xticks([1, 2.5, 4])
    assert figure_problems(fig) == ["axes 'good': x axis 'workers' counts, but has fractional ticks [2.5]"]


def test_colliding_tick_labels():
    fig, ax = good_figure()
    ax.set_yticks([10, 10.5], ["a long label", "another long label"])
    assert any("y tick labels 'a long label' and 'another long label' overlap" in p for p in figure_problems(fig))


def test_strict_mode_raises_and_a_students_run_does_not(monkeypatch):
    fig, _ = good_figure(width=12)
    monkeypatch.setenv("COURSEKIT_STRICT_FIGURES", "1")
    with pytest.raises(FigureStyleError, match="12 x 3 in"):
        enforce(fig)
    with pytest.raises(FigureStyleError):
        png(fig)  # every panel picture goes through the rules
    monkeypatch.setenv("COURSEKIT_STRICT_FIGURES", "0")
    assert png(fig)[:4] == b"\x89PNG"


@pytest.mark.parametrize("strict", ["1", "0"])
def test_png_checks_the_very_drawing_it_saves_and_draws_once(monkeypatch, strict):
    monkeypatch.setenv("COURSEKIT_STRICT_FIGURES", strict)
    fig, _ = good_figure()
    draws = []
    draw = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, renderer: (draws.append(self), draw(self, renderer))[1])
    picture = png(fig)
    assert len(draws) == 1, f"png drew the figure {len(draws)} times"  # checked and saved: one drawing
    monkeypatch.undo()
    saved = io.BytesIO()
    FigureCanvasAgg(good_figure()[0]).print_png(saved)  # what matplotlib writes for the same figure
    saved.seek(0)
    np.testing.assert_array_equal(plt.imread(io.BytesIO(picture)), plt.imread(saved))


def test_show_checks_every_open_pyplot_figure(monkeypatch):
    monkeypatch.setenv("COURSEKIT_STRICT_FIGURES", "1")
    plt.figure(figsize=(11, 3))
    plt.figure(figsize=(4, 3))  # the current one is fine; the first is not
    with pytest.raises(FigureStyleError, match="11 x 3 in"):
        show()
    assert plt.get_fignums() == []  # closed, not left for the next cell
    plt.figure(figsize=(4, 3))
    show()
    plt.close("all")


@pytest.mark.parametrize("low, high", [(3e5, 3.2e5), (2.1e5, 3.1e5), (2e5, 7e5), (1e3, 1e9)])
def test_readable_log_ticks_never_collide(low, high):
    fig = Figure(figsize=(4.5, 3), layout="constrained")
    ax = fig.subplots()
    ax.semilogx([low, high], [0, 1])
    if high / low < 1.1:  # a tenth of a decade: matplotlib's own minor labels collide here
        assert any("tick labels" in p and "overlap" in p for p in figure_problems(fig))
    readable_log_ticks(ax)
    assert figure_problems(fig) == []
    assert all("times" not in t.get_text() for t in ax.get_xticklabels())  # "200k", not 2 x 10^5


def test_text_beyond_a_panel_pictures_edge_is_cut_off():
    fig, ax = good_figure()
    ax.set_title("a title far too long for its axes " * 4)  # constrained layout cannot help
    cut = figure_problems(fig, cropped_to_content=False)
    assert any("is cut off at the figure's edge" in p for p in cut)
    assert not any("cut off" in p for p in figure_problems(fig))  # inline figures are cropped to content
