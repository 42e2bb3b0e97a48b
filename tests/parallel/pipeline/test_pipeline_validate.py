"""The validator rejects impossible schedules; bad arguments get clear errors."""

import numpy as np
import pytest

from coursekit.comm import run_local
from coursekit.nn import MLP
from coursekit.parallel.pipeline import (B, F, I, NAMES, Action, Schedule, ScheduleError, W, execute,
                                         schedule, simulate, validate)


def one_f_one_b_compute(p=2, m=2):
    return [list(schedule("1f1b", p, m).compute(r)) for r in range(p)]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("p,m", [(1, 1), (1, 3), (2, 2), (3, 6), (4, 8)])
def test_generated_schedules_are_valid(name, p, m):
    if name == "gpipe" or m >= p:
        for v in ((1, 2, 3) if name == "interleaved_1f1b" else (1,)):
            assert validate(schedule(name, p, m, chunks=v)).stages == p


def test_from_compute_adds_matching_sends_and_receives():
    s = Schedule.from_compute("x", [[F(0, 0), B(0, 0)], [F(1, 0), B(1, 0)]], 1)
    assert s.actions == ((F(0, 0), Action("SEND_F", 0, 0), Action("RECV_B", 0, 0), B(0, 0)),
                         (Action("RECV_F", 1, 0), F(1, 0), B(1, 0), Action("SEND_B", 1, 0)))


def test_the_input_gradient_travels_after_i_and_w_stays_local():
    s = Schedule.from_compute("x", [[F(0, 0), I(0, 0), W(0, 0)], [F(1, 0), I(1, 0), W(1, 0)]], 1)
    assert s.actions == ((F(0, 0), Action("SEND_F", 0, 0), Action("RECV_B", 0, 0), I(0, 0), W(0, 0)),
                         (Action("RECV_F", 1, 0), F(1, 0), I(1, 0), Action("SEND_B", 1, 0), W(1, 0)))
    assert validate(s) is s


def test_backward_before_its_forward():
    acts = one_f_one_b_compute()
    acts[1] = [B(1, 0), F(1, 0), F(1, 1), B(1, 1)]
    with pytest.raises(ScheduleError, match=r"B1\.0 .* comes before F1\.0"):
        validate(Schedule.from_compute("bad", acts, 2))


def test_weight_gradient_before_its_input_gradient():
    acts = [[F(0, 0), W(0, 0), I(0, 0)], [F(1, 0), I(1, 0), W(1, 0)]]
    with pytest.raises(ScheduleError, match=r"W0\.0 \(position 2\) comes before I0\.0"):
        validate(Schedule.from_compute("bad", acts, 1))


def test_input_gradient_waits_for_the_next_stages_input_gradient_on_the_same_rank():
    # one rank, two stages (v = 2): I0.0 needs I1.0's gradient, whatever letter computed it
    ok = [[F(0, 0), F(1, 0), I(1, 0), B(0, 0), W(1, 0)]]
    assert validate(Schedule.from_compute("ok", ok, 1, chunks=2))
    bad = [[F(0, 0), F(1, 0), I(0, 0), I(1, 0), W(1, 0), W(0, 0)]]
    with pytest.raises(ScheduleError, match=r"I0\.0 \(position 2\) comes before I1\.0"):
        validate(Schedule.from_compute("bad", bad, 1, chunks=2))


@pytest.mark.parametrize("rank1,match", [
    ([F(1, 0), B(1, 0), W(1, 0)], r"rank 1: B1\.0 computes the whole backward .* so W1\.0 must not"),
    ([F(1, 0), I(1, 0), B(1, 0)], r"B1\.0 computes the whole backward .* so I1\.0 must not be there"),
    ([F(1, 0), I(1, 0)], r"I1\.0 has no W1\.0: the weight gradient .* never computed"),
    ([F(1, 0), W(1, 0)], r"W1\.0 has no I1\.0: the input gradient .* never computed"),
    ([F(1, 0)], r"B1\.0 is missing: .* one B \(input and weight gradient\), or one I .* then one W"),
    ([I(1, 0), W(1, 0)], r"F1\.0 is missing"),
])
def test_a_backward_is_one_b_or_one_i_and_one_w(rank1, match):
    acts = [[F(0, 0), I(0, 0), W(0, 0)], rank1]
    with pytest.raises(ScheduleError, match=match):
        validate(Schedule.from_compute("bad", acts, 1))


def test_micro_batches_may_mix_b_with_i_and_w():
    acts = [[F(0, 0), F(0, 1), B(0, 0), I(0, 1), W(0, 1)], [F(1, 0), I(1, 0), F(1, 1), B(1, 1), W(1, 0)]]
    assert validate(Schedule.from_compute("mixed", acts, 2))


@pytest.mark.parametrize("kind", ["b", "G", "BACKWARD", ""])
def test_an_unknown_letter_is_told_every_letter_and_what_it_computes(kind):
    acts = [[F(0, 0), Action(kind, 0, 0)]]
    with pytest.raises(ScheduleError, match=rf"position 1: .* unknown kind {kind!r}; allowed: compute "
                       r"actions F \(forward\), B \(full backward: input and weight gradient\), "
                       r"I \(input gradient only\), W \(weight gradient only\); communication SEND_F"):
        validate(Schedule.from_compute("bad", acts, 1))


def test_something_else_than_an_action_is_told_how_to_build_one():
    with pytest.raises(ScheduleError, match=r"'F0\.0' is not an Action \(build them with F\(s, i\)"):
        validate(Schedule("bad", 1, 1, 1, (("F0.0",),)))


def test_receive_without_send():
    s = schedule("gpipe", 2, 2)
    rank0 = tuple(a for a in s.actions[0] if a != Action("SEND_F", 0, 1))
    with pytest.raises(ScheduleError, match=r"RECV_F1\.1 is a receive with no matching send"):
        validate(Schedule("bad", 2, 2, 1, (rank0, s.actions[1])))


def test_forward_without_its_receive():
    s = schedule("gpipe", 2, 1)
    rank1 = tuple(a for a in s.actions[1] if a.kind != "RECV_F")
    with pytest.raises(ScheduleError, match=r"F1\.0 needs RECV_F1\.0"):
        validate(Schedule("bad", 2, 1, 1, (s.actions[0], rank1)))


def test_deadlock_is_found():
    # rank 0 waits for the gradient before it sends the activation that produces it
    rank0 = (F(0, 0), Action("RECV_B", 0, 0), Action("SEND_F", 0, 0), B(0, 0))
    rank1 = (Action("RECV_F", 1, 0), F(1, 0), B(1, 0), Action("SEND_B", 1, 0))
    with pytest.raises(ScheduleError, match=r"deadlock: rank 0 waits at RECV_B0\.0 .*rank 1 waits"):
        validate(Schedule("bad", 2, 1, 1, (rank0, rank1)))


def test_missing_duplicate_and_misplaced_actions():
    with pytest.raises(ScheduleError, match=r"B1\.1 is missing"):
        validate(Schedule.from_compute("bad", [[F(0, 0), F(0, 1), B(0, 1), B(0, 0)],
                                               [F(1, 0), F(1, 1), B(1, 0)]], 2))
    with pytest.raises(ScheduleError, match="appears twice"):
        validate(Schedule.from_compute("bad", [[F(0, 0), F(0, 0), B(0, 0)]], 1))
    with pytest.raises(ScheduleError, match="lives on rank 1"):
        validate(Schedule.from_compute("bad", [[F(0, 0), B(0, 0), F(1, 0), B(1, 0)], []], 1))
    with pytest.raises(ScheduleError, match="out of range"):
        validate(Schedule.from_compute("bad", [[F(0, 0), B(0, 0), F(0, 5)]], 1))
    assert issubclass(ScheduleError, ValueError)


@pytest.mark.parametrize("args,match", [
    (("pipedream", 2, 4), "unknown schedule 'pipedream'"),
    (("1f1b", 4, 2), r"microbatches >= stages \(2 < 4\)"),
    (("zb_h1", 3, 2), r"microbatches >= stages"),
    (("interleaved_1f1b", 4, 6, 2), "multiple of stages"),
    (("gpipe", 2, 4, 2), "chunks=2: only 'interleaved_1f1b'"),
    (("gpipe", 0, 4), "stages=0: must be >= 1"),
    (("gpipe", 2, 0), "microbatches=0: must be >= 1"),
    (("interleaved_1f1b", 2, 4, 0), "chunks=0: must be >= 1"),
    (("gpipe", 64, 1024), r"64 x 1024 x 1 is too large .* at most 16384"),
])
def test_bad_schedule_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        schedule(*args)


def test_schedule_sizes_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"stages must be an integer >= 1; got 2.0"):
        schedule("gpipe", 2.0, 4)


@pytest.mark.parametrize("kwargs,match", [
    ({"t_f": -1.0}, r"t_f=-1.0: must be >= 0 \(a time\)"),
    ({"p2p": float("nan")}, r"p2p=nan: must be a finite number >= 0 \(a time\)"),
    ({"t_f": 0.0, "t_i": 0.0}, "t_f, t_i and t_w are all 0"),
])
def test_bad_simulate_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        simulate(schedule("gpipe", 2, 2), **kwargs)


def test_stages_that_do_not_divide_the_layers():
    mlp = MLP([4, 5, 5, 3], dtype=np.float64, seed=0)  # 3 layers
    X, y = np.ones((4, 4)), np.zeros(4, dtype=int)
    with pytest.raises(ValueError, match=r"2 pipeline stages .* 3 layers evenly; allowed stage counts: \[1, 3\]"):
        run_local(execute, 2, schedule("gpipe", 2, 2), mlp, X, y)
    with pytest.raises(ValueError, match=r"6 pipeline stages \(ranks x chunks\) cannot split"):
        run_local(execute, 3, schedule("interleaved_1f1b", 3, 3, chunks=2), mlp, X, y)


def test_executor_argument_errors():
    mlp = MLP([4, 5, 3], dtype=np.float64, seed=0)
    X, y = np.ones((4, 4)), np.zeros(4, dtype=int)
    with pytest.raises(ValueError, match="the schedule has 2 ranks but the comm has 3"):
        run_local(execute, 3, schedule("gpipe", 2, 2), mlp, X, y)
    with pytest.raises(ValueError, match="the batch has 4 rows, fewer than the 5 micro-batches"):
        run_local(execute, 2, schedule("gpipe", 2, 5), mlp, X, y)
