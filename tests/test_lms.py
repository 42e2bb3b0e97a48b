"""The LMS gradebooks and the feedback files, written from hand-built rows (no kernel).

The Canvas file is read back with :mod:`csv` and held to the layout of Canvas's own
gradebook export (the columns ``Student, ID, SIS User ID, SIS Login ID, Section`` in that
order, then one column per assignment, and a ``Points Possible`` line under the header).
That is the documented format only: no test imports the file into a live Canvas or Moodle.
"""

import csv
import json

import pytest

from coursekit.course import feedback, lms, release
from coursekit.grading.core import CheckResult
from coursekit.course.gradebook import NOT_RUN, GradingError, Row, _outcomes, _results, write_csv

TODO = "not implemented yet: replace the `raise NotImplementedError` in your function"


def outcome(name, status, message="all cases passed"):
    return CheckResult(name, status, message)


# Given out of order, as no caller should rely on: zoe has no row at all for 02_collectives.
ROWS = [
    Row("zoe", "00_latency_bandwidth", 1, 1, "ok", 3.2, "", (outcome("check_latency", "pass"),)),
    Row("ann", "02_collectives", 1, 2, "error", 4.0, "cell 7: SyntaxError: invalid syntax",
        (outcome("check_binomial_bcast", "pass"), outcome("check_ring_allreduce", "not run", NOT_RUN))),
    Row("ann", "00_latency_bandwidth", 0, 1, "timeout", 20.0, "stopped after 20 s",
        (outcome("check_latency", "not run", NOT_RUN),)),
    Row("bob", "02_collectives", 0, 2, "ok", 2.5, "",
        (outcome("check_binomial_bcast", "todo", TODO),
         outcome("check_ring_allreduce", "fail", "rank 1 got [1. 2.]\nexpected [3. 3.]"))),
    Row("bob", "00_latency_bandwidth", 0, 1, "missing", 0.0, "no 00_latency_bandwidth.ipynb",
        (outcome("check_latency", "not run", NOT_RUN),)),
]
CANVAS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def read(path):
    with open(path, newline="", encoding="utf-8") as stream:
        return list(csv.reader(stream))


def test_canvas_gradebook_is_canvas_export_layout_one_line_per_student(tmp_path):
    lms.write_canvas(ROWS, tmp_path / "canvas.csv")
    lines = read(tmp_path / "canvas.csv")
    assert lines == [
        [*CANVAS_HEADER, "00_latency_bandwidth", "02_collectives"],
        ["Points Possible", "", "", "", "", "1", "2"],
        ["", "", "", "ann", "", "0", "1"],  # a timeout and an error score what they scored
        ["", "", "", "bob", "", "0", "0"],  # missing: 0, and the column is still there
        ["", "", "", "zoe", "", "1", ""],  # no row at all: left empty, not graded
    ]
    header, possible, *students = lines
    assert header[:5] == CANVAS_HEADER and possible[0] == "Points Possible"
    assert all(len(line) == len(header) for line in lines)
    by_login = {line[header.index("SIS Login ID")]: line for line in students}
    assert sorted(by_login) == ["ann", "bob", "zoe"]
    for line in students:  # the id is in SIS Login ID only; Canvas's own columns stay empty
        assert [line[header.index(c)] for c in ("Student", "ID", "SIS User ID", "Section")] == ["", "", "", ""]
        for exercise in header[5:]:
            score = line[header.index(exercise)]
            assert score == "" or 0 <= int(score) <= int(possible[header.index(exercise)])


def test_moodle_gradebook_has_an_id_column_and_one_column_per_grade_item(tmp_path):
    lms.write_moodle(ROWS, tmp_path / "moodle.csv")
    assert read(tmp_path / "moodle.csv") == [
        ["student", "00_latency_bandwidth", "02_collectives"],
        ["ann", "0", "1"],
        ["bob", "0", "0"],
        ["zoe", "1", ""],
    ]


def test_points_possible_and_scores_refuse_rows_that_disagree():
    assert lms.points_possible(ROWS) == {"00_latency_bandwidth": 1, "02_collectives": 2}
    with pytest.raises(GradingError, match="02_collectives is worth 2 points in one row and 3 in another"):
        lms.points_possible([*ROWS, Row("cat", "02_collectives", 0, 3, "ok", 1.0)])
    with pytest.raises(GradingError, match="bob has two rows for 02_collectives"):
        lms.scores([*ROWS, Row("bob", "02_collectives", 2, 2, "ok", 1.0)])


def test_the_long_csv_keeps_its_columns_and_rows(tmp_path):
    write_csv(ROWS, tmp_path / "long.csv")
    lines = read(tmp_path / "long.csv")
    assert lines[0] == ["student", "exercise", "passed", "total", "status", "seconds", "detail"]
    assert lines[1] == ["zoe", "00_latency_bandwidth", "1", "1", "ok", "3.2", ""]
    assert len(lines) == 1 + len(ROWS)


def test_feedback_names_the_score_the_error_and_every_check_that_did_not_pass(tmp_path):
    written = feedback.write_feedback(ROWS, tmp_path / "feedback")
    assert [p.name for p in written] == ["ann.md", "bob.md", "zoe.md"]
    assert (tmp_path / "feedback" / "bob.md").read_text() == (
        "# Feedback for bob\n\n"
        "## 00_latency_bandwidth: 0/1 (missing)\n\n"
        "Not handed in (no 00_latency_bandwidth.ipynb).\n\n"
        "## 02_collectives: 0/2 (ok)\n\n"
        f"- TODO `check_binomial_bcast`: {TODO}\n"
        "- FAIL `check_ring_allreduce`: rank 1 got [1. 2.]\n"
        "  expected [3. 3.]\n")
    assert (tmp_path / "feedback" / "ann.md").read_text() == (
        "# Feedback for ann\n\n"
        "## 00_latency_bandwidth: 0/1 (timeout)\n\n"
        "Timeout: stopped after 20 s\n\n"
        f"- NOT RUN `check_latency`: {NOT_RUN}\n\n"
        "## 02_collectives: 1/2 (error)\n\n"
        "Error: cell 7: SyntaxError: invalid syntax\n\n"
        f"- NOT RUN `check_ring_allreduce`: {NOT_RUN}\n")
    assert (tmp_path / "feedback" / "zoe.md").read_text() == (
        "# Feedback for zoe\n\n## 00_latency_bandwidth: 1/1 (ok)\n\nEvery check passed.\n")


def test_outcomes_come_from_the_structured_log(tmp_path):
    log = tmp_path / "checks.jsonl"
    records = [{"check": "check_a", "status": "pass", "message": "3 cases"},
               {"check": "check_b", "status": "pass", "message": "fine"},
               {"check": "check_b", "status": "fail", "message": "rank 0 got 1"},
               {"check": "check_b", "status": "todo", "message": "not implemented yet"},
               {"check": "check_c", "status": "todo"}]  # a log line without a message
    log.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"check": "check_d", "sta')  # torn
    got = _outcomes(["check_a", "check_b", "check_c", "check_d"], _results(log))
    assert got == (outcome("check_a", "pass", "3 cases"), outcome("check_b", "fail", "rank 0 got 1"),
                   outcome("check_c", "todo", ""), outcome("check_d", "not run", NOT_RUN))


def test_the_command_refuses_an_unknown_lms_and_a_feedback_file_before_grading(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        release.main(["grade", str(tmp_path), "--out", str(tmp_path / "g.csv"), "--lms", "blackboard"])
    assert exit.value.code == 2
    assert "invalid choice: 'blackboard' (choose from 'canvas', 'moodle')" in capsys.readouterr().err
    (tmp_path / "notes.md").write_text("mine")
    assert release.main(["grade", str(tmp_path / "nope"), "--out", str(tmp_path / "g.csv"),
                         "--feedback", str(tmp_path / "notes.md")]) == 2
    assert "notes.md is a file; give a folder" in capsys.readouterr().err
    assert not (tmp_path / "g.csv").exists()
