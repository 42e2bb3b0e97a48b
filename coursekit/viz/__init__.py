"""Plots for the course: per-rank timelines, the shared colour vocabulary, the figure rules."""

from .check import FigureStyleError, figure_problems, show
from .style import COLORS, byte_label, color, integer_ticks, legend_outside, readable_log_ticks, series_color, time_unit
from .timeline import match_messages, plot_timeline

__all__ = ["COLORS", "FigureStyleError", "byte_label", "color", "figure_problems", "integer_ticks", "legend_outside",
           "match_messages", "plot_timeline", "readable_log_ticks", "series_color", "show", "time_unit"]
