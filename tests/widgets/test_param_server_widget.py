"""The chapter 4 panel, driven headlessly on ThreadComm ranks; live progress."""

import matplotlib

matplotlib.use("Agg")

from coursekit.parallel.param_server import PSConfig, PSTopology, train  # noqa: E402
from coursekit.parallel.param_server.pace import measured_iteration_s  # noqa: E402
from coursekit.cluster.runner import LocalRunner  # noqa: E402
from coursekit.widgets.param_server import ParamServerPanel  # noqa: E402

BASE = PSConfig(steps=30, eval_every=5, worker_timeout=2.0)


def test_live_progress_reaches_the_notebook_side():
    seen = []
    config = PSConfig(model="asp", steps=40, eval_every=5, jitter=0.002)
    result = train(LocalRunner(3), config, workers=2, on_update=seen.append)
    assert seen, "on_update was never called"
    last = seen[-1]
    assert last[0] == {} and [d["worker"] for d in last[1:]] == [0, 1]  # the shard publishes nothing
    for d in last[1:]:
        assert d["status"] == "finished" and len(d["accuracy"]) == len(d["t"]) == 8
    assert [list(w.curve_t) for w in result.workers] == [d["t"] for d in last[1:]]


def test_panel_runs_each_consistency_model_and_keeps_them_for_comparison():
    panel = ParamServerPanel(base=BASE, runner=LocalRunner(4))
    live_pictures = []
    panel.live.observe(lambda change: live_pictures.append(bytes(change["new"])), "value")
    assert panel.staleness.disabled is False
    panel.staleness.value = 1
    panel.run_button.click()
    assert panel.wait(60), "the clicked run did not end"
    panel.model.value = "asp"
    assert panel.staleness.disabled is True
    panel.delay.value = 3.0
    panel.run_button.click()
    assert panel.wait(60), "the clicked run did not end"
    assert [r.config.model for r in panel.results] == ["ssp", "asp"]
    ssp, asp = panel.results
    assert ssp.config.staleness == 1 and ssp.staleness.max() <= 1
    assert asp.config.staleness == 0 and asp.config.straggler == {2: 0.003}
    assert bytes(panel.plot.value)[:4] == b"\x89PNG"
    drawn = [p for p in live_pictures if p]
    assert drawn and all(p[:4] == b"\x89PNG" for p in drawn)  # drawn live during the runs
    assert live_pictures[-1] == b""  # cleared at the end: the comparison takes its place
    assert "ASP, 3 workers, 1 server, straggler 3 ms" in panel.status.value
    panel.clear_button.click()
    assert panel.results == []


def test_panel_runs_on_the_workers_and_servers_its_sliders_pick():
    panel = ParamServerPanel(base=BASE, runner=LocalRunner(5))
    panel.workers.value, panel.servers.value = 2, 2  # 4 of the runner's 5 ranks
    panel.run()
    (result,) = panel.results
    assert result.topology == PSTopology(servers=2, workers=2)
    assert len(result.servers) == 2 and [w.worker for w in result.workers] == [0, 1]
    assert "SSP s=2, 2 workers, 2 servers" in panel.status.value


def test_panel_refuses_more_ranks_than_it_has():
    panel = ParamServerPanel(base=BASE, runner=LocalRunner(4))
    panel.servers.value = 2
    panel.workers.value = 3
    assert panel.run() is None
    assert panel.status.value == "error: 2 server(s) + 3 worker(s) need more than the 4 ranks available"


def test_a_slow_server_set_on_the_panel_sets_the_pace_of_bsp():
    panel = ParamServerPanel(base=BASE, runner=LocalRunner(4))
    panel.model.value = "bsp"
    panel.workers.value, panel.servers.value = 2, 2
    panel.slow_server.value = 20.0
    panel.run()
    (result,) = panel.results
    assert result.config.server_delay == {1: 0.02}  # the last shard
    # every BSP iteration waits for that shard's update, which sleeps 20 ms
    assert measured_iteration_s(result) >= 0.02
    assert "BSP, 2 workers, 2 servers, slow server 20 ms" in panel.status.value
