"""Stacked bars: each part starts where the parts below it end."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from coursekit.viz.bars import stacked_bars  # noqa: E402


def test_parts_stack_bottom_first_and_the_tops_are_their_sums():
    ax = Figure().subplots()
    top = stacked_bars(ax, [0, 1], [("compute", [1.0, 2.0], "C0"), ("send", [0.5, 0.0], "C1"),
                                    ("idle", [3.0, 1.0], "C2")])
    np.testing.assert_allclose(top, [4.5, 3.0])
    bars = ax.patches
    assert [b.get_y() for b in bars] == [0.0, 0.0, 1.0, 2.0, 1.5, 2.0]
    assert [b.get_height() for b in bars] == [1.0, 2.0, 0.5, 0.0, 3.0, 1.0]
    assert [c.get_label() for c in ax.containers] == ["compute", "send", "idle"]
