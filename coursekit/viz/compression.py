"""Chapter 6's picture: compressed training runs compared by what they cost.

:func:`plot_runs` draws test accuracy against the bytes a worker sent (left) and against
time (right): solid, the measured time; dashed, the cost model's, i.e. the measured
compute plus the predicted exchange time for the link ``alpha`` (s) and ``beta`` (s/B),
t = (t_run - t_exchange) + t_exchange^model(alpha, beta).
"""

from __future__ import annotations

from matplotlib.figure import Figure

from .style import color, legend_outside, readable_log_ticks, series_color

__all__ = ["plot_runs"]


def plot_runs(results, alpha: float, beta: float, fig: Figure | None = None) -> Figure:
    """Accuracy against bytes sent (left) and against time (right), one colour per run,
    drawn into ``fig`` (default: a new headless 10 x 3.6 in Figure)."""
    fig = fig or Figure(figsize=(10, 3.6), layout="constrained")
    ax_b, ax_t = fig.subplots(1, 2)
    for i, r in enumerate(results):
        c = series_color(i)
        ax_b.semilogx(r.wire_bytes, r.test_accuracy, "o-", ms=3, color=c,
                      label=f"{r.config.label}, p={r.p}")
        compute = r.seconds - r.exchange_seconds
        ax_t.plot(r.seconds, r.test_accuracy, "o-", ms=3, color=c)
        ax_t.plot(compute + r.predicted_exchange_seconds(alpha, beta), r.test_accuracy, "--",
                  color=c)
    ax_b.set(xlabel="sent per worker [bytes]", ylabel="test accuracy")
    readable_log_ticks(ax_b)
    ax_t.set(xlabel="time [s] (solid: measured, dashed: cost model)", ylabel="test accuracy")
    ax_t.plot([], [], "-", color=color("message"), label="measured")
    ax_t.plot([], [], "--", color=color("message"), label="cost model")
    legend_outside(ax_b)
    legend_outside(ax_t)
    return fig
