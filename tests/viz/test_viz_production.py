"""Chapter 9's picture of MPI's collectives beside the course's, on a hand-made result."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from coursekit.production.mpi_collectives import (  # noqa: E402
    Measurement, MpiCollectivesConfig, MpiCollectivesResult)
from coursekit.viz import figure_problems  # noqa: E402
from coursekit.viz.production import plot_mpi_collectives  # noqa: E402


def made_up(p: int) -> MpiCollectivesResult:
    config = MpiCollectivesConfig(sizes=(1 << 10, 1 << 20, 4 << 20))  # 1 and 4 MiB: close
    nbytes = np.array([8 * n for n in config.items(p)])
    rows = []
    for collective in config.collectives:
        sides = [("MPI", "MPI")] + [(a, t) for t in ("MpiComm", "ZmqComm")
                                    for a in config.course_algorithms(collective)]
        for k, (implementation, transport) in enumerate(sides):
            seconds = (k + 1) * (1e-5 + nbytes * 1e-9)
            rows.append(Measurement(collective, implementation, transport, seconds, seconds,
                                    nbytes / seconds, np.zeros(3)))
    return MpiCollectivesResult(config, p, nbytes, tuple(rows), "MPICH")


def test_a_row_per_p_a_panel_per_collective_busbw_in_gb_per_s_within_the_figure_rules():
    runs = [made_up(2), made_up(4)]
    fig = plot_mpi_collectives(runs)
    assert figure_problems(fig, cropped_to_content=False) == []
    assert [ax.get_title() for ax in fig.axes] == [
        f"{c}, p = {p}" for p in (2, 4) for c in runs[0].config.collectives]
    allreduce = fig.axes[0]
    assert len(allreduce.lines) == 7  # MPI + 3 algorithms x 2 Comms
    np.testing.assert_allclose(allreduce.lines[0].get_ydata(), runs[0].measurements[0].busbw / 1e9)
    assert [t.get_text() for t in allreduce.get_xticklabels()] == ["1 KiB", "1 MiB", "4 MiB"]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:3] == ["MPI's own call", "ring on MpiComm", "recursive_doubling on MpiComm"]
    assert len(labels) == len(set(labels)) == 11  # every implementation once


def test_it_draws_into_a_given_figure():
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    assert plot_mpi_collectives([made_up(4)], fig=fig) is fig
    assert len(fig.axes) == 4 and figure_problems(fig, cropped_to_content=False) == []
