"""The chapter-5 check passes 1F1B and fails GPipe, impossible orders and stubs."""

from coursekit.grading.ch05 import check_one_f_one_b
import pytest

from coursekit.parallel.pipeline import B, F, I, Action, W, schedule


def reference(p, m):
    return [schedule("1f1b", p, m).compute(r) for r in range(p)]


def test_check_accepts_1f1b():
    assert check_one_f_one_b(reference, quiet=True)


def test_check_rejects_gpipe_for_its_memory():
    def gpipe(p, m):
        return [[F(r, i) for i in range(m)] + [B(r, i) for i in range(m)] for r in range(p)]
    result = check_one_f_one_b(gpipe, quiet=True)
    assert result.status == "fail" and "peak activations" in result.message and "GPipe" in result.message


def test_check_rejects_backward_before_forward():
    def backward_first(p, m):
        acts = reference(p, m)
        acts[0] = [B(0, 0)] + [a for a in acts[0] if a != B(0, 0)]
        return acts
    result = check_one_f_one_b(backward_first, quiet=True)
    assert result.status == "fail" and "B0.0 (position 0) comes before F0.0" in result.message


def test_check_rejects_deadlock():
    def deadlock(p, m):  # on 2 ranks: rank 0 waits for B of mb 0, rank 1 for F of mb 1
        if p != 2:
            return reference(p, m)
        rank1 = [F(1, 1), B(1, 1), F(1, 0), B(1, 0)] + reference(p, m)[1][4:]
        return [[F(0, 0), B(0, 0), F(0, 1), B(0, 1)] + reference(p, m)[0][4:], rank1]
    result = check_one_f_one_b(deadlock, quiet=True)
    assert result.status == "fail" and "deadlock" in result.message


ALLOWED = "1F1B uses only F (forward) and B (full backward: input and weight gradient)"


@pytest.mark.parametrize("letter,meaning", [(I, "input gradient only"), (W, "weight gradient only")])
def test_check_rejects_a_split_backward_naming_the_letters_and_what_they_compute(letter, meaning):
    def split(p, m):
        return [[letter(a.stage, a.mb) if a.kind == "B" else a for a in acts] for acts in reference(p, m)]
    result = check_one_f_one_b(split, quiet=True)
    assert result.status == "fail"
    assert f"{letter(0, 0)} has the letter {letter(0, 0).kind!r} ({meaning}); {ALLOWED}; I then W split" \
        in result.message


def test_check_rejects_an_unknown_letter():
    def backward_as_b(p, m):  # lower case: not an action letter
        return [[Action("b", a.stage, a.mb) if a.kind == "B" else a for a in acts] for acts in reference(p, m)]
    result = check_one_f_one_b(backward_as_b, quiet=True)
    assert result.status == "fail" and f"b0.0 has the letter 'b' (no action has it); {ALLOWED}" in result.message


def test_check_reports_garbage_and_stubs():
    result = check_one_f_one_b(lambda p, m: [["F0"] * m for _ in range(p)], quiet=True)
    assert result.status == "fail" and "per rank" in result.message

    def stub(p, m):
        raise NotImplementedError
    assert check_one_f_one_b(stub, quiet=True).status == "todo"
