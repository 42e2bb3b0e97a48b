"""The course's figure rules, checked on the drawn figure: what fits a laptop screen and reads well.

JupyterLab on a 1366 x 768 laptop shows about 1,000 pixels of notebook width, and
matplotlib draws 100 pixels per inch, so a figure is at most :data:`MAX_WIDTH_IN` wide and
:data:`MAX_HEIGHT_IN` high. Beyond that the browser shrinks it and its text with it.
:func:`figure_problems` lists every broken rule of a figure (empty: it is fine):

* size: width <= 10 in, height <= 7.5 in;
* fonts: every text between 7 and 13 pt (one vocabulary: 10 pt body, smaller legends);
* legends: no data point (line vertex, marker, top of a bar) under a legend;
* looks: two labelled series in one axes never share colour, line style and marker;
* counts: an axis that counts (workers, ranks, stages, epochs, staleness ...) has integer ticks;
* ticks: no two tick labels of one axis overlap;
* edges (panel pictures only, which are not cropped to their content): no text cut off.

:func:`show` checks the current figure, then shows it: chapters call it instead of
``plt.show()``; panels turn every picture into a PNG with :func:`png`, which checks the
very drawing it saves. A broken rule raises only in strict mode
(``COURSEKIT_STRICT_FIGURES=1``, set by the test suite, so nbval and the widget tests fail
on it); a student's run is never stopped by a figure's looks.
"""

from __future__ import annotations

import io
import os
import re

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.image import imsave
from matplotlib.patches import Rectangle

__all__ = ["FigureStyleError", "MAX_HEIGHT_IN", "MAX_WIDTH_IN", "enforce", "figure_problems", "png", "show",
           "strict"]

MAX_WIDTH_IN, MAX_HEIGHT_IN = 10.0, 7.5
FONT_PT = (7.0, 13.0)
COUNT_AXIS = re.compile(
    r"^(number of |# ?)?(workers?|ranks?|stages?|epochs?|staleness|gpus?|servers?|micro-?batch(es)?|nodes?|engines?)\b",
    re.IGNORECASE,
)


class FigureStyleError(ValueError):
    """A figure that breaks the course's figure rules; the message lists every problem."""


def figure_problems(fig: Figure, *, cropped_to_content: bool = True, drawn: bool = False) -> list[str]:
    """Every rule ``fig`` breaks, one readable line each (draws the figure to measure it).

    ``cropped_to_content=False``: the picture is the figure's own box (a panel's PNG), so
    text beyond its edge is cut off and counts as a problem; notebooks' inline figures are
    saved cropped to their content (``bbox_inches="tight"``), where it does not.
    ``drawn=True``: ``fig.canvas`` (an Agg canvas) has just drawn the figure as it is, so
    that drawing is measured instead of drawing it again (:func:`png` draws once).
    """
    if not drawn:
        if fig.canvas is None or not hasattr(fig.canvas, "get_renderer"):
            FigureCanvasAgg(fig)
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = _size_problems(fig) + _font_problems(fig)
    if not cropped_to_content:
        problems += _cut_off_problems(fig, renderer)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        name = _name(ax)
        problems += [f"{name}: {p}" for p in _legend_problems(ax, renderer)]
        problems += [f"{name}: {p}" for p in _colour_problems(ax)]
        problems += [f"{name}: {p}" for p in _count_axis_problems(ax)]
        problems += [f"{name}: {p}" for p in _tick_overlap_problems(ax, renderer)]
    return problems


def strict() -> bool:
    """Whether broken figure rules raise (``COURSEKIT_STRICT_FIGURES=1``: the test suite)."""
    return os.environ.get("COURSEKIT_STRICT_FIGURES") == "1"


def enforce(fig: Figure, *, cropped_to_content: bool = True, drawn: bool = False) -> None:
    """In strict mode, raise FigureStyleError listing every rule ``fig`` breaks
    (``drawn``: see :func:`figure_problems`)."""
    if not strict():
        return
    problems = figure_problems(fig, cropped_to_content=cropped_to_content, drawn=drawn)
    if problems:
        raise FigureStyleError("this figure breaks the course's figure rules:\n  " + "\n  ".join(problems))


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes (no pyplot, no display: works in callbacks, threads,
    headless), after :func:`enforce` with ``cropped_to_content=False`` (the PNG is the
    figure's box: nothing may stick out). The figure is drawn once: the rules measure
    the very drawing whose pixels the PNG holds (what ``print_png`` writes, without
    drawing it again)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    enforce(fig, cropped_to_content=False, drawn=True)
    buf = io.BytesIO()
    imsave(buf, canvas.buffer_rgba(), format="png", origin="upper", dpi=fig.dpi)
    return buf.getvalue()


def show() -> None:
    """:func:`enforce` the rules on every open pyplot figure, then show them as ``plt.show()``
    does (a figure that breaks a rule is closed, not left for the next cell)."""
    import matplotlib.pyplot as plt

    for number in plt.get_fignums():
        fig = plt.figure(number)
        try:
            enforce(fig)
        except FigureStyleError:
            plt.close("all")
            raise
    plt.show()


def _name(ax: Axes) -> str:
    title = ax.get_title() or ax.get_ylabel() or "untitled"
    return f"axes {title!r}"


def _size_problems(fig: Figure) -> list[str]:
    width, height = fig.get_size_inches()
    if width <= MAX_WIDTH_IN + 1e-9 and height <= MAX_HEIGHT_IN + 1e-9:
        return []
    return [f"figure is {width:g} x {height:g} in; at most {MAX_WIDTH_IN:g} x {MAX_HEIGHT_IN:g} in fits a laptop screen"]


def _labels_in_view(axis) -> list:
    """The tick labels matplotlib draws: those of ticks inside the view limits (an axis
    keeps labels for ticks beyond its limits, which are never drawn)."""
    low, high = sorted(axis.get_view_interval())
    slack = 1e-9 * abs(high - low)
    return [label for tick in axis.get_major_ticks() + axis.get_minor_ticks()
            if low - slack <= tick.get_loc() <= high + slack for label in (tick.label1, tick.label2)
            if label.get_visible() and label.get_text().strip()]


def _drawn_texts(fig: Figure) -> list:
    """Every visible, non-empty text matplotlib draws (tick labels: :func:`_labels_in_view`)."""
    axes = [axis for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)]
    tick_labels = {id(label) for axis in axes for tick in axis.get_major_ticks() + axis.get_minor_ticks()
                   for label in (tick.label1, tick.label2)}
    others = [t for t in fig.findobj(lambda a: hasattr(a, "get_fontsize") and hasattr(a, "get_text"))
              if id(t) not in tick_labels and t.get_visible() and t.get_text().strip()]
    return others + [label for axis in axes for label in _labels_in_view(axis)]


def _font_problems(fig: Figure) -> list[str]:
    low, high = FONT_PT
    by_size: dict[float, list[str]] = {}
    for text in _drawn_texts(fig):
        if not low <= text.get_fontsize() <= high:
            by_size.setdefault(text.get_fontsize(), []).append(text.get_text()[:30])
    return [f"{len(texts)} texts are {size:g} pt (e.g. {texts[0]!r}); allowed {low:g}-{high:g} pt"
            for size, texts in sorted(by_size.items())]


def _cut_off_problems(fig: Figure, renderer) -> list[str]:
    frame = fig.bbox
    out = []
    for text in _drawn_texts(fig):
        box = text.get_window_extent(renderer)
        if box.x0 < frame.x0 - 1 or box.x1 > frame.x1 + 1 or box.y0 < frame.y0 - 1 or box.y1 > frame.y1 + 1:
            out.append(f"text {text.get_text()[:30]!r} is cut off at the figure's edge")
    return out


def _data_points(ax: Axes) -> np.ndarray:
    """Display coordinates of the axes' data: line vertices, scatter offsets, bar tops."""
    points = [line.get_transform().transform(np.column_stack(line.get_data()).astype(float))
              for line in ax.get_lines() if line.get_visible() and len(line.get_xdata())]
    for coll in ax.collections:
        offsets = np.asarray(coll.get_offsets(), float)
        if coll.get_visible() and offsets.size:
            points.append(coll.get_offset_transform().transform(offsets))
    bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_visible() and p.get_height()]
    if bars:
        tops = np.array([(b.get_x() + b.get_width() / 2, b.get_y() + b.get_height()) for b in bars], float)
        points.append(ax.transData.transform(tops))
    if not points:
        return np.empty((0, 2))
    xy = np.concatenate(points)
    return xy[np.isfinite(xy).all(axis=1)]


def _legend_problems(ax: Axes, renderer) -> list[str]:
    legend = ax.get_legend()
    if legend is None or not legend.get_visible():
        return []
    box = legend.get_window_extent(renderer)
    xy = _data_points(ax)
    inside = (xy[:, 0] > box.x0) & (xy[:, 0] < box.x1) & (xy[:, 1] > box.y0) & (xy[:, 1] < box.y1)
    if inside.any():
        return [f"the legend covers {int(inside.sum())} data points; put it outside the data"]
    return []


def _colour_problems(ax: Axes) -> list[str]:
    seen: dict[tuple, str] = {}
    out = []
    for artist in list(ax.get_lines()) + list(ax.collections):
        label = artist.get_label()
        if not label or label.startswith("_"):
            continue
        rgba = _colour_of(artist)
        if rgba is None:
            continue
        # same colour, line style and marker: the reader cannot tell the two apart
        look = (rgba, _style_of(artist))
        if look in seen and seen[look] != label:
            out.append(f"{seen[look]!r} and {label!r} share one colour (and line style)")
        seen.setdefault(look, label)
    return out


def _style_of(artist) -> tuple:
    if hasattr(artist, "get_linestyle") and hasattr(artist, "get_marker"):
        return artist.get_linestyle(), artist.get_marker()
    return ()


def _colour_of(artist) -> tuple | None:
    if hasattr(artist, "get_color") and not hasattr(artist, "get_facecolor"):
        return tuple(np.round(to_rgba(artist.get_color()), 3))
    colours = np.asarray(artist.get_facecolor())
    if colours.size == 0:
        return None
    return tuple(np.round(colours.reshape(-1, 4)[0], 3))


def _count_axis_problems(ax: Axes) -> list[str]:
    out = []
    for which, axis, limits in (("x", ax.xaxis, ax.get_xlim()), ("y", ax.yaxis, ax.get_ylim())):
        label = axis.get_label().get_text().strip()
        if not COUNT_AXIS.match(label) or axis.get_scale() != "linear":
            continue
        lo, hi = sorted(limits)
        ticks = [t for t in axis.get_ticklocs() if lo - 1e-9 <= t <= hi + 1e-9]
        fractional = [float(t) for t in ticks if abs(t - round(t)) > 1e-9]
        if fractional:
            out.append(f"{which} axis {label!r} counts, but has fractional ticks {fractional[:3]}")
    return out


def _tick_overlap_problems(ax: Axes, renderer) -> list[str]:
    out = []
    for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        boxes = [(label.get_window_extent(renderer), label.get_text()) for label in _labels_in_view(axis)]
        for i, (a, text_a) in enumerate(boxes):
            for b, text_b in boxes[i + 1:]:
                if a.overlaps(b) and a.width > 0 and b.width > 0:
                    out.append(f"{which} tick labels {text_a!r} and {text_b!r} overlap")
    return out
