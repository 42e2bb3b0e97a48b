"""Chapter 4 panel: train on the parameter server with the consistency model the controls pick.

Thin by design: Run builds a :class:`~coursekit.parallel.param_server.config.PSConfig` and a
:class:`~coursekit.parallel.param_server.protocol.PSTopology` (the workers and server shards)
from the controls, runs them with :func:`~coursekit.parallel.param_server.train` on the panel's
runner (its cluster's engines, or a ``runner=LocalRunner(n)``) and follows the workers' live
progress (:mod:`coursekit.cluster.live`): the accuracy curves grow while the run goes. At the end it
draws accuracy against wall-clock time and against gradients applied (every run so far, to
compare), the staleness histogram and per-worker time (the pictures:
:mod:`coursekit.viz.param_server`).
Layout, Run / Stop, errors and a lost cluster: :class:`coursekit.widgets.panel.Panel`;
nothing is printed, everything works headless (tests set ``panel.model.value = "asp"``
and call ``panel.run()``).
"""

from __future__ import annotations

import dataclasses

import ipywidgets as widgets

from coursekit.nn.mlp import check_device
from coursekit.parallel.param_server import train
from coursekit.parallel.param_server.config import PSConfig
from coursekit.parallel.param_server.protocol import PSTopology
from coursekit.viz.param_server import label, plot_live, plot_runs
from coursekit.widgets.panel import (Panel, device_summary, hide_when_empty, png, run_target,
                                     size_limit)

__all__ = ["ParamServerPanel"]


class ParamServerPanel(Panel):
    """Controls: consistency model, staleness bound, workers, servers, straggler delay, slow
    server (the last shard sleeps that long in every update it applies); Run.

    ``max_ranks`` bounds servers + workers (None: the runner's or cluster's size); ``base``
    holds every other setting (steps, lr ...); ``device`` ("cpu", "cuda", "auto"; None:
    ``base.device``, "cpu" by default) is where the workers compute, e.g.
    ``ParamServerPanel(cluster=c, device="cuda")`` on a GPU cluster; the status line says
    where they did. ``data``: the Dataset (None: the digits);
    ``panel_options`` (``cluster`` or ``runner``, ``restart``, ``prepare``) go to
    :class:`Panel`. ``panel.results`` keeps every finished run; ``panel.live`` shows
    each worker's accuracy while a run goes.
    """

    def __init__(self, max_ranks: int | None = None, base: PSConfig | None = None, *,
                 data=None, device: str | None = None, **panel_options):
        # a server and a worker at least
        max_ranks = size_limit("max_ranks", max_ranks, run_target(panel_options), minimum=2)
        self.data = data
        self.max_ranks = max_ranks
        self.base = base or PSConfig(steps=100, eval_every=10, worker_timeout=2.0)
        if device is not None:
            self.base = dataclasses.replace(self.base, device=check_device(device))
        style = {"description_width": "130px"}
        self.model = widgets.ToggleButtons(options=[("BSP", "bsp"), ("SSP", "ssp"), ("ASP", "asp")],
                                           value="ssp", description="consistency", style=style)
        self.staleness = widgets.IntSlider(2, min=0, max=10, description="staleness s", style=style)
        self.workers = widgets.IntSlider(max_ranks - 1, min=1, max=max_ranks - 1,
                                         description="workers", style=style)
        self.servers = widgets.IntSlider(1, min=1, max=max_ranks - 1, description="server shards",
                                         style=style)
        self.delay = widgets.FloatSlider(0.0, min=0.0, max=20.0, step=1.0, readout_format=".0f",
                                         description="straggler [ms]", style=style)
        self.slow_server = widgets.FloatSlider(0.0, min=0.0, max=60.0, step=5.0, readout_format=".0f",
                                               description="slow server [ms]", style=style)
        self.live = hide_when_empty(widgets.Image(format="png"))
        self.model.observe(lambda _: self._sync_controls(), names="value")
        self._sync_controls()
        super().__init__([self.model, self.staleness, self.workers, self.servers, self.delay,
                          self.slow_server],
                         keep_runs=True, outputs=[self.live],
                         hint="Pick a consistency model and press Run.", **panel_options)

    def _sync_controls(self) -> None:
        self.staleness.disabled = self.model.value != "ssp"

    def topology(self) -> PSTopology:
        """The servers and workers the sliders pick (ValueError if they do not fit)."""
        if self.workers.value + self.servers.value > self.max_ranks:
            raise ValueError(f"{self.servers.value} server(s) + {self.workers.value} worker(s) "
                             f"need more than the {self.max_ranks} ranks available")
        return PSTopology(self.servers.value, self.workers.value)

    def config(self) -> PSConfig:
        """The PSConfig the other controls describe."""
        delay, slow = self.delay.value / 1e3, self.slow_server.value / 1e3
        return dataclasses.replace(
            self.base, model=self.model.value,
            staleness=self.staleness.value if self.model.value == "ssp" else 0,
            straggler={self.workers.value - 1: delay} if delay else {},
            server_delay={self.servers.value - 1: slow} if slow else {})

    def compute(self):
        """Run with the current settings, following the workers live."""
        topology, config = self.topology(), self.config()
        self.say(f"running {label(config, topology)} ...")
        return train(self.runner(), config, self.data, workers=topology.workers,
                     servers=topology.servers, on_update=self.on_data)

    def draw_live(self, data: list[dict]) -> None:
        title = "live: accuracy of the weights each worker pulled"
        self.live.value = png(plot_live(data, title))

    def show(self, result) -> None:
        worst = result.staleness_histogram()[0].max(initial=0)  # over every gradient applied
        self.say(f"{label(result.config, result.topology)}: {result.applied} gradients in "
                 f"{result.wall_s:.2f} s, max staleness {worst}; "
                 f"{device_summary(result.devices, 'worker')}, shards on the host")
        self.live.value = b""  # the comparison below has every run's curves: keep it in view
        self.plot.value = png(plot_runs(self.results))
