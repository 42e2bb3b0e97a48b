"""The course's one colour vocabulary: every plot colours the same activity the same way.

Use :func:`color` (``color("send")``) rather than hex codes, so that a timeline in chapter 2
and a pipeline schedule in chapter 5 speak the same language. Time axes say their unit
(:func:`time_unit`, ``"time [ms]"``); byte axes use :func:`byte_label`.
"""

from __future__ import annotations

COLORS = {
    "compute": "#4C72B0",    # generic computation
    "forward": "#4C72B0",    # forward pass (a kind of compute)
    "backward": "#8172B3",   # backward pass (B: the input gradient, or all of it)
    "weight_grad": "#DA8BC3",  # zero-bubble W: the weight gradient, split from B
    "optimizer": "#64B5CD",  # parameter update
    "send": "#DD8452",       # handing a message to the transport
    "recv": "#55A868",       # waiting for / copying in a message
    "comm": "#C44E52",       # a whole collective, when not split into send/recv
    "idle": "#DDDDDD",       # waiting: bubbles, stragglers
    "message": "#555555",    # arrows from a send to its recv
    "measured": "#C44E52",   # measured curves
    "predicted": "#4C72B0",  # cost-model curves
}
"""Activity name -> matplotlib colour."""


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
