"""Plots for the course: per-rank timelines and the shared colour vocabulary."""

from .style import COLORS, byte_label, color, time_unit
from .timeline import match_messages, plot_timeline

__all__ = ["COLORS", "byte_label", "color", "match_messages", "plot_timeline", "time_unit"]
