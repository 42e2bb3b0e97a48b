"""The one panel every chapter builds on: controls, Run / Stop, a status line, a progress
bar and a plot, the same layout and the same behaviour in every chapter.

A chapter's panel subclasses :class:`Panel`, builds its controls and implements two
methods: :meth:`Panel.compute` calls the chapter's pure experiment function with the
settings the controls show, :meth:`Panel.show` draws its result (``self.say(...)`` for the
status line, ``self.plot.value = png(fig)`` for the picture). The base does the rest:

- **Run** disables itself and enables **Stop** while a run goes. A click runs in a
  background thread, so the kernel stays free to receive the Stop click;
  ``panel.run()`` called from code runs synchronously and returns the result (for tests
  and notebook cells), ``panel.wait(timeout)`` joins a clicked run.
- Errors from the experiment or from the engines (``ValueError``, ``TypeError``,
  ``TimeoutError``, :class:`coursekit.cluster.EngineError`, :class:`coursekit.comm.CommError`,
  ipyparallel's remote errors ...) become one readable line, ``error: ...``, in the
  status; the exception is kept in ``panel.error``. Nothing is printed.
- **Stop** interrupts the engines of the panel's cluster (SIGINT, the same as
  ``cluster.interrupt()``); a run without a cluster stops at its next progress callback.
  ``prepare(cluster)``, if given, then makes the engines ready again (e.g.
  ``setup_comm``: fresh comms, without the messages of an interrupted collective); so it
  does after a run that failed on the ranks (a comm error, a rank's failure).
- While a run goes, the cluster is checked every ``poll`` seconds: if it disappeared
  (stopped, controller gone, an engine died) the panel says so, stops waiting, and shows
  a **Restart cluster** button that stops what is left of it, calls ``restart()`` (given
  by the notebook, e.g. ``lambda: cluster.start(n=4)``), ``prepare``-s the new cluster and
  uses it from then on (``panel.cluster``). Every wait has a timeout: the kernel never
  freezes on a dead cluster.
- Progress streamed from the engines (:mod:`coursekit.cluster.live`): pass :meth:`Panel.on_data`
  as the experiment's ``on_update``; it moves the progress bar (the smallest ``step`` of
  the ranks that report a ``total``) and calls the panel's :meth:`Panel.draw_live` hook at most
  every ``live_interval`` seconds (drawing a figure takes a good fraction of a second).

Key widgets carry CSS classes, for the browser test and for styling: ``ck-panel``,
``ck-run``, ``ck-stop``, ``ck-restart``, ``ck-clear``, ``ck-status``, ``ck-notice`` (other
users disturbing the timings: :mod:`coursekit.cluster.contention`), ``ck-progress``,
``ck-plot``.
"""

from __future__ import annotations

import threading
import time

import ipywidgets as widgets

from coursekit.viz.check import png  # every panel's picture: checked and saved in one drawing
from coursekit.widgets.health import cluster_problem, error_message

__all__ = ["Panel", "RunStopped", "device_summary", "png", "size_limit"]


def hide_when_empty(image: widgets.Image) -> widgets.Image:
    """Show ``image`` only while it holds a picture (an empty one renders as a broken image)."""
    def sync(_=None):
        image.layout.display = None if len(image.value) else "none"

    image.observe(sync, "value")
    sync()
    return image


def size_limit(name: str, value, cluster, minimum: int = 1, default: int | None = None) -> int:
    """The largest number of ranks a panel offers: ``value``, else the size of ``cluster``,
    else ``default``; a ValueError unless it is an int >= ``minimum``."""
    if value is None:
        value = cluster.size if cluster is not None else default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value


def device_summary(devices, unit: str = "rank") -> str:
    """Where the ranks computed, in a few words for a status line: ``devices[i]`` is rank
    i's ("cpu" or "cuda:<id>", :attr:`coursekit.nn.MLP.device_name`; None: rank lost).

    "4 ranks on cpu", "ranks 0-3 on cuda:0..3" (one GPU each, in order), else one item
    per rank: "rank 0 on cuda:0, rank 1 on cpu".
    """
    devices = list(devices)
    if not devices:
        return f"no {unit}s"
    if None not in devices and len(set(devices)) == 1:
        return f"{len(devices)} {unit}{'s' if len(devices) > 1 else ''} on {devices[0]}"
    gpus = [d[5:] for d in devices if d is not None and d.startswith("cuda:")]
    if (len(gpus) == len(devices) and all(g.isdigit() for g in gpus)
            and [int(g) for g in gpus] == list(range(int(gpus[0]), int(gpus[0]) + len(gpus)))):
        return f"{unit}s 0-{len(devices) - 1} on cuda:{gpus[0]}..{gpus[-1]}"
    return ", ".join(f"{unit} {i} " + ("lost" if d is None else f"on {d}")
                     for i, d in enumerate(devices))


def run_target(panel_options: dict):
    """The ``runner=`` or else the ``cluster=`` among a panel's options (what sizes it);
    a ValueError naming both when neither is given."""
    where = panel_options.get("runner") or panel_options.get("cluster")
    if where is None:
        raise ValueError("give cluster= (a started cluster) or runner= (e.g. LocalRunner(4))")
    return where


class RunStopped(Exception):
    """Raised by a panel's progress callbacks once Stop was pressed: ends a local run."""


class _ClusterGone(Exception):
    """The panel's cluster disappeared while a run was waiting for it."""


class LiveRepr:
    """A widget whose plain-text form is one readable line, not ipywidgets' repr of its
    children: that text is what a notebook shows before it runs, and on GitHub."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}: live; run this notebook in JupyterLab to see and use it"


def _button(description: str, css: str, **kwargs) -> widgets.Button:
    button = widgets.Button(description=description, **kwargs)
    button.add_class(css)
    return button


class Panel(LiveRepr, widgets.VBox):
    """Controls (``columns`` columns of them), Run / Stop / Restart, a progress bar, the
    status line, extra ``outputs`` (widgets shown above the plot) and the ``plot`` (an
    ``Image``; give one to use a subclass such as a live plot).

    ``keep_runs=True``: every result is also appended to ``panel.results`` (for plots that
    compare runs) and a **Clear runs** button empties it.

    ``auto=True``: every change of a control runs the experiment at once (for fast,
    simulated experiments); Run still works. ``cluster``: the cluster the experiment uses
    (Stop interrupts it, its health is watched); ``runner``: a
    :class:`~coursekit.cluster.runner.LocalRunner` to run on instead of a cluster (tests, a quick
    demo); :meth:`runner` gives the one to use now. ``restart() -> cluster`` and
    ``prepare(cluster)``: see the module docstring. The latest result is ``panel.result``
    (None after an error or a stop).
    """

    def __init__(self, controls, *, columns: int = 1, outputs=(), plot=None, keep_runs=False,
                 cluster=None, runner=None, restart=None, prepare=None, auto: bool = False,
                 hint: str = "Pick the settings and press Run.", poll: float = 0.2,
                 stop_grace: float = 10.0, live_interval: float = 0.5):
        self.cluster, self.restart_fn, self.prepare = cluster, restart, prepare
        self.local_runner = runner
        self.poll, self.stop_grace, self.live_interval = poll, stop_grace, live_interval
        self.result = self.error = None
        self._thread = None                 # a clicked run
        self._stopping = threading.Event()
        self._busy = threading.Lock()
        self._live_at = -float("inf")
        self.run_button = _button("Run", "ck-run", button_style="primary", icon="play")
        self.stop_button = _button("Stop", "ck-stop", icon="stop", disabled=True)
        self.restart_button = _button("Restart cluster", "ck-restart", button_style="warning",
                                      icon="refresh", layout=widgets.Layout(display="none"))
        self.progress = widgets.IntProgress(0, min=0, max=1, layout=widgets.Layout(width="200px"))
        self.progress.add_class("ck-progress")
        self.status = widgets.HTML()
        self.status.add_class("ck-status")
        self.notice = widgets.HTML()  # "timings disturbed: ..." (coursekit.cluster.contention)
        self.notice.add_class("ck-notice")
        self.plot = hide_when_empty(plot if plot is not None else widgets.Image(format="png"))
        self.plot.add_class("ck-plot")
        self.run_button.on_click(lambda _: self.click_run())
        self.stop_button.on_click(lambda _: self.stop())
        self.restart_button.on_click(lambda _: self.restart())
        buttons = []
        if keep_runs:
            self.results = []
            self.clear_button = _button("Clear runs", "ck-clear", icon="trash")
            self.clear_button.on_click(lambda _: self.clear())
            buttons.append(self.clear_button)
        self._keep_runs, self._hint = keep_runs, hint
        controls = list(controls)
        per_column = -(-len(controls) // columns)
        grid = widgets.HBox([widgets.VBox(controls[i:i + per_column])
                             for i in range(0, len(controls), per_column)])
        bar = widgets.HBox([self.run_button, self.stop_button, *buttons, self.restart_button,
                            self.progress])
        super().__init__([grid, bar, self.status, self.notice, *outputs, self.plot])
        self.add_class("ck-panel")
        if auto:
            for control in controls:
                control.observe(lambda _: self._auto_run(), names="value")
        self.say(hint)

    # ---- what a chapter's panel implements -------------------------------------------------

    def compute(self):
        """Call the experiment with the current settings and return its result."""
        raise NotImplementedError

    def runner(self):
        """Where the experiment runs now: the ``runner`` given, else the engines of the
        panel's cluster (the restarted one after a Restart)."""
        if self.local_runner is not None:
            return self.local_runner
        if self.cluster is None:
            raise ValueError("this panel has neither a runner= nor a cluster= to run on")
        from coursekit.cluster.runner import ClusterRunner
        return ClusterRunner(self.cluster)

    def show(self, result) -> None:
        """Draw ``result``: the status line and the plot."""
        raise NotImplementedError

    def draw_live(self, data: list[dict]) -> None:
        """Redraw from the ranks' streamed data while a run goes (default: nothing)."""

    # ---- helpers for subclasses ------------------------------------------------------------

    def say(self, text: str) -> None:
        """Put ``text`` in the status line (plain text, shown as it is: ``&`` and ``<``
        are escaped, so ``status.value`` reads like the text)."""
        self.status.value = str(text).replace("&", "&amp;").replace("<", "&lt;")

    def _check_stop(self) -> None:
        """Raise :class:`RunStopped` in a run that Stop ended or the panel abandoned."""
        if self._stopping.is_set() or getattr(threading.current_thread(), "ck_abandoned", False):
            raise RunStopped("stopped")

    def progress_to(self, step: int, total: int) -> None:
        """Move the progress bar; raises :class:`RunStopped` once Stop was pressed."""
        self._check_stop()
        self.progress.max = max(int(total), 1)
        self.progress.value = min(max(int(step), 0), self.progress.max)

    def on_data(self, data: list[dict]) -> None:
        """``on_update`` for :func:`coursekit.cluster.live.follow`: progress bar and :meth:`draw_live`."""
        self._check_stop()
        reporting = [d for d in data if d.get("total")]
        if reporting:
            self.progress_to(min(int(d.get("step", 0)) for d in reporting),
                             max(int(d["total"]) for d in reporting))
        if time.monotonic() - self._live_at >= self.live_interval:
            self._live_at = time.monotonic()
            self.draw_live(data)

    # ---- running -----------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while a run (clicked or called) is going."""
        return self._busy.locked()

    def click_run(self) -> None:
        """What the Run button does: :meth:`run` in a background thread."""
        if self.running:
            return
        self._thread = threading.Thread(target=self.run, name="coursekit-panel-run", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = 60.0) -> bool:
        """Wait up to ``timeout`` s for a clicked run; True if none is going any more."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not (self._thread is not None and self._thread.is_alive())

    def run(self):
        """Run the experiment with the current settings, show it and return the result
        (None after an error, a stop, or a lost cluster: the status line says which)."""
        if not self._busy.acquire(blocking=False):
            return None
        self._stopping.clear()
        self._live_at = -float("inf")
        self.result = self.error = None
        self.run_button.disabled, self.stop_button.disabled = True, False
        self.progress.value = 0
        self.say("running ...")
        try:
            self.result = self._watch()
            if self._keep_runs:
                self.results.append(self.result)
            self.show(self.result)
            self.check_contention()
        except _ClusterGone as gone:
            self._cluster_gone(str(gone))
        except BaseException as err:  # noqa: BLE001 - every failure becomes the status line
            self.error = err
            if self._stopping.is_set():
                self._stopped()
            elif (problem := cluster_problem(self.cluster)) is not None:
                self._cluster_gone(problem)
            else:
                self.say(f"error: {error_message(err, self.cluster)}{self._ready_again(err)}")
            if not self._keep_runs:  # the old picture would show a setting the error refused
                self.plot.value = b""
            if isinstance(err, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            self.run_button.disabled, self.stop_button.disabled = False, True
            self._busy.release()
        return self.result

    def _watch(self):
        """Run :meth:`compute` in a worker thread; meanwhile watch the cluster and Stop."""
        outcome = {}

        def work():
            try:
                outcome["result"] = self.compute()
            except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
                outcome["error"] = err

        if (problem := cluster_problem(self.cluster)) is not None:
            raise _ClusterGone(problem)
        worker = threading.Thread(target=work, name="coursekit-panel-work", daemon=True)
        worker.start()
        stop_deadline = None
        try:
            while worker.is_alive():
                worker.join(self.poll)
                if not worker.is_alive():
                    break
                if (problem := cluster_problem(self.cluster)) is not None:
                    raise _ClusterGone(problem)
                if self._stopping.is_set():
                    stop_deadline = stop_deadline or time.monotonic() + self.stop_grace
                    if time.monotonic() > stop_deadline:
                        raise RunStopped("the run did not end within "
                                         f"{self.stop_grace:g} s; it ends in the background")
        except BaseException as err:
            worker.ck_abandoned = True  # its late callbacks raise RunStopped
            if isinstance(err, KeyboardInterrupt):  # the kernel was interrupted: stop too
                self.stop()
            raise
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    def check_contention(self) -> None:
        """After a run on a cluster: say in the notice line when other users' work disturbed
        its timings (:mod:`coursekit.cluster.contention`); clear the line when nothing did."""
        if self.cluster is None:
            return
        from coursekit.cluster.contention import observe
        message = observe(self.cluster).message()
        self.notice.value = message.replace("&", "&amp;").replace("<", "&lt;")

    def stop(self) -> None:
        """What the Stop button does: interrupt the engines (or the local run)."""
        if not self.running or self._stopping.is_set():
            return
        self._stopping.set()
        self.say("stopping ...")
        if self.cluster is not None:
            try:
                self.cluster.interrupt()
            except Exception as err:  # noqa: BLE001 - a dead cluster cannot be signalled
                self.error = err

    def _stopped(self) -> None:
        text = "stopped"
        if isinstance(self.error, RunStopped) and str(self.error) != "stopped":
            text += f" ({self.error})"
        self.say(text + self._ready_again(self.error) + ".")

    def _ready_again(self, err) -> str:
        """After a run the engines broke off (stopped, a comm error, a rank's failure: any
        error but a setting refused up front, a TypeError or ValueError), make them ready
        again with ``prepare``: a collective that broke off leaves its comm
        refusing every later call (:meth:`coursekit.comm.Comm.collective`), and the next Run
        must start clean. Returns what to add to the status line when that fails."""
        if self.cluster is None or self.prepare is None:
            return ""
        if isinstance(err, (TypeError, ValueError)) and not self._stopping.is_set():
            return ""  # a setting refused before any rank ran: nothing to repair
        try:
            self.prepare(self.cluster)
        except Exception as failure:  # noqa: BLE001 - shown, not raised
            self.error = failure
            return f"; making the engines ready again failed: {error_message(failure)}"
        return ""

    # ---- a lost cluster ------------------------------------------------------------------------

    def _cluster_gone(self, problem: str) -> None:
        if self.restart_fn is None:
            self.say(f"the cluster is gone ({problem}): start a new one (cluster.start) "
                     "and build the panel again.")
            return
        self.say(f"the cluster is gone ({problem}): press Restart cluster for a new one.")
        self.restart_button.layout.display = None

    def restart(self) -> None:
        """What the Restart button does: stop what is left of the old cluster, start a new
        one with ``restart()`` and use it from now on."""
        if self.restart_fn is None or self.running:
            return
        self.restart_button.disabled = True
        self.say("starting a new cluster ...")
        try:
            if self.cluster is not None:
                try:
                    self.cluster.stop()
                except Exception:  # noqa: BLE001 - what is left of a dead cluster
                    pass
            self.cluster = self.restart_fn()
            if self.prepare is not None:
                self.prepare(self.cluster)
        except Exception as err:  # noqa: BLE001 - shown, not raised
            self.error = err
            self.say(f"error: the restart failed: {error_message(err)}")
            return
        finally:
            self.restart_button.disabled = False
        self.restart_button.layout.display = "none"
        self.say(f"new cluster ready ({self.cluster!r}): press Run.")

    def clear(self) -> None:
        """What the Clear runs button does: forget the runs so far and their plot."""
        self.results = []
        self.plot.value = b""
        self.say(f"Cleared. {self._hint}")

    def _auto_run(self) -> None:
        if not self.running:
            self.run()
