"""The one Span type: what data parallel, the parameter server, the pipeline and the
simulator record, and what every timeline reads."""

import pytest

from coursekit.comm.trace import now
from coursekit.parallel.pipeline import Action, F, schedule, simulate
from coursekit.parallel.spans import Span, SpanRecorder, step_totals


def test_a_recorder_makes_spans_of_its_rank_and_take_empties_it():
    rec = SpanRecorder(3)
    rec.record("forward", 1.0, 1.5)
    with rec.comm():
        pass
    spans = rec.take()
    assert [(s.rank, s.kind, s.action) for s in spans] == [(3, "forward", None), (3, "comm", None)]
    assert spans[0] == Span(3, "forward", 1.0, 1.5) and spans[0].duration == 0.5
    assert spans[1].start <= spans[1].end and rec.take() == []


def test_step_totals_adds_the_durations_of_the_kinds_asked_for():
    spans = [Span(0, "forward", 0.0, 1.0), Span(0, "comm", 1.0, 1.25), Span(0, "backward", 1.25, 3.25)]
    assert step_totals(spans, ("forward", "backward")) == 3.0
    assert step_totals(spans, ("comm",)) == 0.25 and step_totals(spans, ("idle",)) == 0.0


def test_a_pipeline_span_carries_its_action_and_its_kind():
    span = Span.of_action(2, F(5, 1), 0.5, 2.0)
    assert span == Span(2, "F", 0.5, 2.0, Action("F", 5, 1))
    assert (span.action.stage, span.action.mb, span.duration) == (5, 1, 1.5)
    res = simulate(schedule("1f1b", 2, 3), t_f=1.0, t_i=1.5, t_w=0.5)  # B = I + W: 2.0
    spans = [s for rank in res.timeline for s in rank]
    # the pipeline's spans are read like every other: totals by kind, one clock
    assert step_totals(spans, ("F",)) == pytest.approx(2 * 3 * 1.0)
    assert step_totals(spans, ("B",)) == pytest.approx(2 * 3 * 2.0)


def test_a_slow_recorder_stretches_compute_to_slow_factor_times_and_refuses_a_speed_up():
    rec = SpanRecorder(0, slow_factor=3.0)
    with rec.compute():
        t0 = now()
        sum(range(20000))
        inner = now() - t0
    (span,) = rec.take()
    assert span.kind == "compute" and span.duration >= 3.0 * inner  # spins 2x after the block
    with pytest.raises(ValueError, match=r"slow_factor must be >= 1 \(1 = normal speed\)"):
        SpanRecorder(0, slow_factor=0.5)


def test_part_stretches_a_stragglers_compute_but_not_its_staging():
    rec = SpanRecorder(1, slow_factor=5.0)
    inner = {}
    for kind in ("compute", "stage"):
        with rec.part(kind):
            t0 = now()
            sum(range(20000))
            inner[kind] = now() - t0
    compute, stage = rec.take()
    assert (compute.kind, stage.kind) == ("compute", "stage")
    assert compute.duration >= 5.0 * inner["compute"]  # a slower processor ...
    assert stage.duration < 2.0 * inner["stage"] + 1e-3  # ... copies at the link's speed
