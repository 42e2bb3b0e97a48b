"""Pipeline schedules and the simulator against the closed-form bubble and memory formulas."""

import itertools

import numpy as np
import pytest

from coursekit.parallel.pipeline import NAMES, B, F, I, Schedule, W, schedule, simulate

GRID = [(p, m) for p in (1, 2, 3, 4, 5) for m in (p, p + 1, 2 * p, 3 * p + 1)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", GRID)
def test_gpipe_1f1b_bubble_closed_form(name, p, m):
    t_f, t_i, t_w = 1.0, 1.5, 1.0
    t_b = t_i + t_w  # a full backward B
    res = simulate(schedule(name, p, m), t_f=t_f, t_i=t_i, t_w=t_w)
    assert res.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert res.total_time == pytest.approx((m + p - 1) * (t_f + t_b))
    np.testing.assert_allclose(res.idle, (p - 1) * (t_f + t_b))


@pytest.mark.parametrize("p,m", GRID)
def test_peak_activations_gpipe_m_and_1f1b_at_most_p(p, m):
    np.testing.assert_array_equal(simulate(schedule("gpipe", p, m)).peak_activations, m)
    peak = simulate(schedule("1f1b", p, m)).peak_activations
    np.testing.assert_array_equal(peak, [p - r for r in range(p)])
    assert peak.max() <= p


@pytest.mark.parametrize("p,v,groups", list(itertools.product((2, 3, 4), (1, 2, 3, 4), (1, 2, 3))))
def test_interleaved_bubble_shrinks_by_v(p, v, groups):
    m, times = p * groups, dict(t_f=1.0, t_i=1.0, t_w=1.0)
    inter = simulate(schedule("interleaved_1f1b", p, m, chunks=v), **times)
    plain = simulate(schedule("1f1b", p, m), **times)
    np.testing.assert_allclose(inter.idle * v, plain.idle)
    assert inter.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1))
    # same work per rank: the times are per micro-batch through a rank's whole share
    np.testing.assert_allclose(inter.busy, plain.busy)


def test_interleaved_with_one_chunk_is_1f1b():
    assert schedule("interleaved_1f1b", 4, 8).actions == schedule("1f1b", 4, 8).actions


def test_interleaved_holds_more_activations_than_1f1b():
    inter = simulate(schedule("interleaved_1f1b", 4, 8, chunks=2)).peak_activations
    plain = simulate(schedule("1f1b", 4, 8)).peak_activations
    assert inter[0] > plain[0]


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 32), (3, 7)])
def test_zb_h1_bubble_close_to_a_third(p, m):
    res = simulate(schedule("zb_h1", p, m), t_f=1.0, t_i=1.0, t_w=1.0)
    # every rank idles (p-1)(T_F + T_I - T_W) = p-1 against 3m of work
    np.testing.assert_allclose(res.idle, p - 1)
    assert res.bubble_fraction == pytest.approx((p - 1) / (3 * m + p - 1))
    assert abs(res.bubble_fraction - (p - 1) / (3 * m)) <= (p - 1) ** 2 / (3 * m) ** 2
    one_f = simulate(schedule("1f1b", p, m), t_f=1.0, t_i=1.0, t_w=1.0)
    assert res.bubble_fraction < one_f.bubble_fraction  # 1F1B idles (p-1) * 3
    assert res.peak_activations.max() <= p


@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (3, 5)])
def test_zb_h1_with_free_w_is_1f1b(p, m):
    zb = simulate(schedule("zb_h1", p, m), t_f=1.0, t_i=2.0, t_w=0.0)
    assert zb.total_time == pytest.approx(simulate(schedule("1f1b", p, m), t_f=1.0, t_i=2.0).total_time)


def test_each_letter_lasts_its_own_time_and_b_is_i_plus_w():
    sched = Schedule.from_compute("mixed", [[F(0, 0), B(0, 0), F(0, 1), I(0, 1), W(0, 1)]], 2)
    res = simulate(sched, t_f=1.0, t_i=2.0, t_w=3.0)
    assert [(s.action, s.end - s.start) for s in res.timeline[0]] == \
        [(F(0, 0), 1.0), (B(0, 0), 5.0), (F(0, 1), 1.0), (I(0, 1), 2.0), (W(0, 1), 3.0)]


def test_a_split_backward_does_the_work_of_a_full_one():
    times = dict(t_f=1.0, t_i=1.0, t_w=0.5)
    one_f = simulate(schedule("1f1b", 2, 4), **times)
    np.testing.assert_allclose(one_f.busy, 4 * (1.0 + 1.5))
    np.testing.assert_allclose(simulate(schedule("zb_h1", 2, 4), **times).busy, one_f.busy)


@pytest.mark.parametrize("p,m", [(2, 3), (4, 6)])
def test_gpipe_point_to_point_cost(p, m):
    t_f, t_i, t_w, c = 1.0, 1.5, 0.5, 0.25
    t_b = t_i + t_w
    res = simulate(schedule("gpipe", p, m), t_f=t_f, t_i=t_i, t_w=t_w, p2p=c)
    # (p-1) hops forward and (p-1) back, each paying t + p2p on the critical path
    assert res.total_time == pytest.approx(m * (t_f + t_b) + (p - 1) * (t_f + t_b + 2 * c))


@pytest.mark.parametrize("name", NAMES)
def test_timeline_follows_schedule_order_without_overlap(name):
    s = schedule(name, 3, 6, chunks=2 if name == "interleaved_1f1b" else 1)
    res = simulate(s, t_f=1.0, t_i=2.0, t_w=0.5, p2p=0.1)
    for r, spans in enumerate(res.timeline):
        assert [sp.action for sp in spans] == s.compute(r)
        assert all(sp.rank == r and sp.kind == sp.action.kind for sp in spans)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(spans, spans[1:]))
    assert res.total_time == pytest.approx(max(sp.end for spans in res.timeline for sp in spans))
