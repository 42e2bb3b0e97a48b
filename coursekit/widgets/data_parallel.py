"""Chapter 3's control panel and live view; the pictures are :mod:`coursekit.viz.data_parallel`'s.

:class:`DataParallelPanel` is thin: Run reads the controls into a
:class:`~coursekit.parallel.data_parallel.config.DPConfig`, calls
:func:`~coursekit.parallel.data_parallel.train` on the panel's runner (its cluster's
engines, or a ``runner=LocalRunner(n)``) with ``on_update=``, moves the progress bar and
redraws the loss so far and the latest step's per-rank timeline while the engines train
(:func:`~coursekit.viz.data_parallel.plot_live`), then draws the loss curve and the
timeline of the last steps (:func:`~coursekit.viz.data_parallel.plot_run`).
Layout, Stop, errors and a lost cluster: :class:`coursekit.widgets.panel.Panel`. Tests
drive it headlessly: ``panel.workers.value = 3``, ``panel.run()``.
"""

from __future__ import annotations

from dataclasses import replace

import ipywidgets as widgets
from matplotlib.figure import Figure

from coursekit.collectives import ALGORITHMS
from coursekit.parallel.data_parallel.config import EXCHANGES, DPConfig
from coursekit.parallel.data_parallel import train
from coursekit.parallel.data_parallel.lr_rules import RULES
from coursekit.viz import byte_label
from coursekit.viz.data_parallel import plot_live, plot_run
from coursekit.nn.mlp import check_device
from coursekit.widgets.panel import LiveRepr, Panel, device_summary, png, run_target, size_limit
from coursekit.widgets.transport import control_for

__all__ = ["DataParallelPanel", "LiveView"]

AVERAGE_EVERY_MAX = 16  # the largest k the "average every" slider offers (local SGD)
# The bucket dropdown: its label -> DPConfig.bucket_bytes (None: the gradient in one piece)
BUCKETS = {"one piece": None, **{byte_label(b): b for b in (8 << 10, 64 << 10, 256 << 10, 1 << 20)}}


def live_label(data) -> str:
    """'step 12, test accuracy 0.914' from the ranks' streamed data."""
    evals = data[0].get("evals") or []
    acc = f", test accuracy {evals[-1][1]:.3f}" if evals else ""
    return f"step {min(d.get('step', 0) for d in data)}{acc}"


class LiveView(LiveRepr, widgets.VBox):
    """``on_update`` for :func:`coursekit.cluster.live.follow`: :func:`plot_live` and a label,
    redrawn as the data arrive."""

    def __init__(self):
        self.image = widgets.Image(format="png")
        self.label = widgets.Label("waiting for the first update ...")
        super().__init__([self.label, self.image])

    def update(self, data) -> None:
        self.label.value = live_label(data)
        self.image.value = png(plot_live(data))


class DataParallelPanel(Panel):
    """Controls for one run: workers, exchange, averaging interval k (``average_every``,
    enabled for exchange "average": local SGD), algorithm, LR rule, per-worker batch,
    straggler factor, bucket size, and on a cluster the transport
    (:mod:`coursekit.widgets.transport`); Run / Stop, a live progress bar, loss + timeline.

    Trains on ``data`` (evaluated on ``eval_data``) with :func:`train`; ``max_workers``
    (None: the runner's or cluster's size); ``base`` holds every other setting;
    ``panel_options`` (``cluster`` or ``runner``, ``restart``, ``prepare``) go to
    :class:`Panel`. ``device`` ("cpu", "cuda", "auto"; None: ``base.device``) is where the
    workers compute, e.g. ``DataParallelPanel(cluster=c, data=d, device="cuda")`` on a GPU
    cluster; the status line ends with where each rank computed. The latest result is
    ``panel.result``.
    """

    def __init__(self, max_workers: int | None = None, base: DPConfig | None = None,
                 *, data, eval_data=None, device: str | None = None, **panel_options):
        max_workers = size_limit("max_workers", max_workers, run_target(panel_options))
        self.data, self.eval_data = data, eval_data
        self.base = base or DPConfig()
        if device is not None:
            self.base = replace(self.base, device=check_device(device))
        style = {"description_width": "120px"}
        self.workers = widgets.IntSlider(max_workers, min=1, max=max_workers,
                                         description="workers", style=style)
        self.exchange = widgets.Dropdown(options=EXCHANGES, value="allreduce",
                                         description="exchange", style=style)
        self.every = widgets.IntSlider(self.base.average_every, min=1,
                                       max=max(AVERAGE_EVERY_MAX, self.base.average_every),
                                       description="average every", style=style,
                                       disabled=self.exchange.value != "average")
        self.exchange.observe(self._exchange_changed, names="value")
        self.algorithm = widgets.Dropdown(options=ALGORITHMS["allreduce"], value="ring",
                                          description="algorithm", style=style)
        self.lr_rule = widgets.Dropdown(options=RULES, value="linear", description="LR rule",
                                        style=style)
        self.batch = widgets.IntSlider(32, min=1, max=128, description="batch / worker",
                                       style=style)
        self.slow = widgets.FloatSlider(1.0, min=1.0, max=8.0, step=0.5,
                                        description="straggler x", style=style)
        self.bucket = widgets.Dropdown(options=list(BUCKETS), value="one piece",
                                       description="bucket", style=style)
        self.transport = control_for(panel_options, style)
        extra = [self.transport.dropdown] if self.transport else []
        super().__init__([self.workers, self.exchange, self.every, self.algorithm, self.lr_rule,
                          self.batch, self.slow, self.bucket, *extra], columns=2,
                         **panel_options)

    def _exchange_changed(self, change) -> None:
        """k applies to local SGD only: the slider is enabled for exchange "average"."""
        self.every.disabled = change["new"] != "average"

    def config(self) -> DPConfig:
        """The settings the controls describe (ValueError for an impossible combination)."""
        n = self.workers.value
        average = self.exchange.value == "average"
        return replace(self.base, exchange=self.exchange.value, algorithm=self.algorithm.value,
                       average_every=self.every.value if average else 1,
                       lr_rule=self.lr_rule.value, batch_size=self.batch.value * n,
                       straggler_rank=0 if self.slow.value > 1 else None,
                       slow_factor=self.slow.value,
                       bucket_bytes=BUCKETS[self.bucket.value]
                       if self.exchange.value == "allreduce" else None)

    def compute(self):
        """Train with the current settings (on the transport picked), following the
        workers live."""
        if self.transport:
            self.transport.apply(self.cluster)
        return train(self.runner(), self.config(), self.data, self.eval_data,
                     workers=self.workers.value, on_update=self.on_data)

    def draw_live(self, data) -> None:
        self.say(f"running: {live_label(data)}")
        self.plot.value = png(plot_live(data))

    def show(self, r) -> None:
        self.say(f"{r.step_breakdown()}; final loss {r.loss[-1]:.3f}; {device_summary(r.devices)}")
        self.plot.value = png(plot_run(r, fig=Figure(figsize=(10, 3.4))))
