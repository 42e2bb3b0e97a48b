"""Plots for the course: per-rank timelines, stacked bars, the shared colour vocabulary, the
figure rules.

Each chapter's pictures are functions of its results in their own module (``training``,
``collectives``, ``data_parallel``, ``param_server``, ``pipeline``, ``compression``,
``at_scale``, ``memory``); they draw into a given Figure or Axes (else a new Figure, which
they return) and never run an experiment: the panels (:mod:`coursekit.widgets`) and the
notebooks call them.
"""

from .check import FigureStyleError, figure_problems, show
from .style import COLORS, byte_label, color, integer_ticks, legend_outside, readable_log_ticks, series_color, time_unit
from .timeline import match_messages, plot_timeline

__all__ = ["COLORS", "FigureStyleError", "byte_label", "color", "figure_problems", "integer_ticks", "legend_outside",
           "match_messages", "plot_timeline", "readable_log_ticks", "series_color", "show", "time_unit"]
