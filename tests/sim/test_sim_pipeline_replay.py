"""Chapter-5 pipeline schedules replayed on the simulator's network."""

import pytest

from coursekit.parallel.pipeline import NAMES, schedule, simulate
from coursekit.sim import Network
from coursekit.sim.pipeline_replay import programs_from_schedule, replay_schedule

FREE = dict(alpha_intra=1e-15, beta_intra=1e-18, alpha_inter=1e-15, beta_inter=1e-18)


def sched_for(name, p=4, m=8):
    return schedule(name, p, m, chunks=2 if name == "interleaved_1f1b" else 1)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("times", [(1.0, 1.0, 1.0), (1.0, 2.0, 0.0), (0.5, 1.5, 0.7)])
def test_free_links_give_simulate_at_p2p_zero(name, times):
    sched = sched_for(name)
    expected = simulate(sched, *times, p2p=0.0)
    got = replay_schedule(sched, Network(2, 2, **FREE), *times)
    assert got.total_time == pytest.approx(expected.total_time, rel=1e-9)
    assert got.bubble_fraction == pytest.approx(expected.bubble_fraction, abs=1e-9)


def test_each_letter_replays_in_its_own_colour():
    spans = replay_schedule(sched_for("zb_h1"), Network(2, 2, **FREE), 1.0, 1.0, 1.0).replay.spans
    computed = {s.kind for s in spans} - {"send", "idle"}
    assert computed == {"forward", "input_grad", "weight_grad"}
    spans = replay_schedule(sched_for("1f1b"), Network(2, 2, **FREE)).replay.spans
    assert {s.kind for s in spans} - {"send", "idle"} == {"forward", "backward"}


def test_two_stages_one_microbatch_by_hand():
    """F0, message, F1, B1, message back, B0: 2 t_f + 2 (t_i + t_w) + 2 (alpha + n beta)."""
    net = Network(1, 2, 1e-6, 1e-9, 1e-3, 1e-8)  # two nodes: the hop is inter-node
    r = replay_schedule(schedule("gpipe", 2, 1), net, t_f=0.01, t_i=0.015, t_w=0.005,
                        activation_bytes=1000)
    assert r.total_time == pytest.approx(2 * 0.01 + 2 * 0.02 + 2 * (1e-3 + 1000 * 1e-8))


def test_stages_across_nodes_pay_the_slower_link():
    sched = sched_for("1f1b")
    one_node = replay_schedule(sched, Network(4, 1, 1e-6, 1e-10, 1e-3, 1e-8), activation_bytes=10**6)
    two_nodes = replay_schedule(sched, Network(2, 2, 1e-6, 1e-10, 1e-3, 1e-8), activation_bytes=10**6)
    free = simulate(sched, 1.0, 1.0, 0.0).total_time
    assert free < one_node.total_time < two_nodes.total_time


def test_every_message_is_matched():
    programs = programs_from_schedule(sched_for("interleaved_1f1b"), activation_bytes=8)
    sends = sorted((r, op.dst, op.tag) for r, prog in enumerate(programs) for op in prog
                   if type(op).__name__ == "Send")
    recvs = sorted((op.src, r, op.tag) for r, prog in enumerate(programs) for op in prog
                   if type(op).__name__ == "Recv")
    assert sends == recvs and len(set(sends)) == len(sends)


def test_bad_input():
    with pytest.raises(ValueError, match="must match"):
        replay_schedule(sched_for("gpipe"), Network(2, 1, **FREE))
    with pytest.raises(ValueError, match="t_i"):
        programs_from_schedule(sched_for("gpipe"), t_i=-1.0)
    with pytest.raises(ValueError, match="all 0"):
        programs_from_schedule(sched_for("gpipe"), 0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="activation_bytes"):
        programs_from_schedule(sched_for("gpipe"), activation_bytes=-5)
