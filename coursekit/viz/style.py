"""The course's one colour vocabulary: every plot colours the same activity the same way.

Use :func:`color` (``color("send")``) rather than hex codes, so that a timeline in chapter 2
and a pipeline schedule in chapter 5 speak the same language. Time axes say their unit
(:func:`time_unit`, ``"time [ms]"``); byte axes use :func:`byte_label`.
"""

from __future__ import annotations

import numpy as np

COLORS = {
    "compute": "#4C72B0",    # generic computation
    "forward": "#4C72B0",    # forward pass (a kind of compute)
    "backward": "#8172B3",   # backward pass (B: the full backward, input and weight gradient)
    "input_grad": "#4B3F8A",   # I: the input gradient only (a darker B: a split backward's first half)
    "weight_grad": "#DA8BC3",  # W: the weight gradient only (its second half, which can wait)
    "optimizer": "#64B5CD",  # parameter update
    "send": "#DD8452",       # handing a message to the transport
    "recv": "#55A868",       # waiting for / copying in a message
    "comm": "#C44E52",       # a whole collective, when not split into send/recv
    "idle": "#DDDDDD",       # waiting: bubbles, stragglers
    "stage": "#937860",      # host <-> device copies around a GPU's compute
    "message": "#555555",    # arrows from a send to its recv
    "measured": "#C44E52",   # measured curves
    "predicted": "#4C72B0",  # cost-model curves
}
"""Activity name -> matplotlib colour."""


def series_color(index: int) -> str:
    """The colour of the ``index``-th method compared in one plot (matplotlib's cycle: C0, C1 ...).

    Activities (compute, send ...) use :func:`color`; methods (allreduce vs parameter server,
    one compressor vs another) use this, so two methods never share a colour.
    """
    return f"C{index % 10}"


def color(kind: str) -> str:
    """The colour of activity ``kind``; ValueError lists the known kinds."""
    try:
        return COLORS[kind]
    except KeyError:
        raise ValueError(f"unknown activity {kind!r}; known: {sorted(COLORS)}") from None


def time_unit(span_s: float) -> tuple[str, float]:
    """A readable unit for a time span in seconds: ("us", 1e6), ("ms", 1e3) or ("s", 1)."""
    if span_s < 2e-3:
        return "us", 1e6
    if span_s < 2.0:
        return "ms", 1e3
    return "s", 1.0


def byte_label(nbytes: float) -> str:
    """'1 KiB', '64 MiB' ... for axis ticks and titles."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def legend_outside(ax, **kwargs):
    """A legend to the right of ``ax``, never over its data (the figure rules' legend rule).

    Use with ``layout="constrained"`` (or ``bbox_inches="tight"``) so the figure makes room.
    """
    options = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0,
               "fontsize": 8, "frameon": False, **kwargs}
    return ax.legend(**options)


def integer_ticks(ax, which: str = "x") -> None:
    """Ticks only at whole numbers on a counting axis (epochs, workers, staleness ...)."""
    from matplotlib.ticker import MaxNLocator

    for name in which:
        getattr(ax, f"{name}axis").set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def readable_log_ticks(ax, which: str = "x", decimals: bool = False) -> None:
    """Log-axis labels that never collide: short labels ("200k", "5M") at 1, 2 and 5 times
    each power of ten when the axis spans at most two decades, at powers of ten beyond;
    minor ticks unlabelled (matplotlib labels them in ``a x 10^b`` form when the axis spans
    less than a decade, and they overlap). ``decimals``: plain decimals ("0.5", "0.02", "2")
    instead of SI prefixes, for a dimensionless axis such as a loss, where "500m" reads as
    a unit. Call it after plotting: it reads the limits."""
    import math

    from matplotlib.ticker import EngFormatter, FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    formatter = FuncFormatter(lambda v, _: np.format_float_positional(v, precision=6, trim="-")) \
        if decimals else EngFormatter(sep="")

    for name in which:
        axis = getattr(ax, f"{name}axis")
        low, high = sorted(getattr(ax, f"get_{name}lim")())
        if not (0 < low < high < math.inf):  # nothing sensible to plot yet: matplotlib's decades
            axis.set_major_locator(LogLocator(base=10))
            axis.set_minor_formatter(NullFormatter())
            continue
        subs = (1.0, 2.0, 5.0) if math.log10(high / low) <= 2 else (1.0,)
        inside = [m * 10**k for k in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
                  for m in subs if low <= m * 10**k <= high]
        # a narrow axis (less than 1-2-5 apart) gets a few evenly spaced ticks instead
        axis.set_major_locator(LogLocator(base=10, subs=subs) if len(inside) >= 2 else MaxNLocator(nbins=3))
        axis.set_major_formatter(formatter)
        axis.set_minor_formatter(NullFormatter())
