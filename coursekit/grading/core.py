"""The machinery every exercise check shares.

A check is a function decorated with :func:`check`. It receives the student's
function, runs it on test inputs, and raises :class:`CheckFailure` with a
message that names the input, what was expected and what came back. The
decorator turns that into one friendly line for the student:

* ``PASS  <name>: <details>`` when every case passed,
* ``FAIL  <name>: <message>`` when a case failed (the student's own exception
  is reported by type and message, never as a bare traceback),
* ``TODO  <name>: not implemented yet ...`` when the student's function still
  raises the stub's ``NotImplementedError``.

The decorated check returns a :class:`CheckResult`, which is truthy only on a
pass, so tests can ``assert check_x(solution)`` and ``assert not check_x(stub)``.

When the environment names a file in ``COURSEKIT_GRADING_LOG`` (the gradebook,
:mod:`coursekit.course.gradebook`, sets it for the kernel it grades in), every check also
appends one JSON line ``{"check": <function name>, "status": ..., "message": ...}`` to it:
the grader counts results from that file instead of parsing the printed lines, and the
message is what the student's feedback file quotes.

Under nbgrader's ``autograde`` or ``validate`` (nbgrader sets ``NBGRADER_EXECUTION`` to
``"autograde"`` or ``"validate"`` in the environment of the kernel it runs a notebook in) a
check that does not pass raises :class:`CheckFailure` with its line after printing it:
nbgrader counts a test cell as failed only if it raises (or writes to stderr), so a blank
or wrong submission scores 0 for that check. Everywhere else (the student's own lab,
``coursekit release grade``) a check never raises: the student reads one line, no
traceback, and the notebook runs on.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

__all__ = ["CheckFailure", "CheckResult", "check", "GRADING_LOG", "NBGRADER_EXECUTION"]

#: environment variable naming the file a check appends its result to, if set
GRADING_LOG = "COURSEKIT_GRADING_LOG"
#: environment variable nbgrader sets in the kernels of ``autograde`` and ``validate``
#: (nbgrader/converters/autograde.py, nbgrader/validator.py; documented in nbgrader's FAQ)
NBGRADER_EXECUTION = "NBGRADER_EXECUTION"


class CheckFailure(AssertionError):
    """Raised inside a check when the student's result is wrong."""


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check: ``status`` is "pass", "fail" or "todo"."""

    name: str
    status: str
    message: str

    def __bool__(self) -> bool:
        return self.status == "pass"

    def __str__(self) -> str:
        label = {"pass": "PASS", "fail": "FAIL", "todo": "TODO"}[self.status]
        return f"{label}  {self.name}: {self.message}"

    def _repr_pretty_(self, printer, cycle):  # IPython shows the line, not the dataclass
        printer.text(str(self))

    def _ipython_display_(self):
        """As a cell's last value, show nothing more: the check already printed its line."""


def check(name: str):
    """Decorate ``fn(student_fn, ...)`` so that it prints and returns a CheckResult.

    The decorated function returns a short success detail (str) or None.
    """

    def decorate(fn):
        @functools.wraps(fn)
        def run(*args, quiet: bool = False, **kwargs) -> CheckResult:
            try:
                detail = fn(*args, **kwargs)
                result = CheckResult(name, "pass", detail or "all cases passed")
            except NotImplementedError:
                result = CheckResult(
                    name,
                    "todo",
                    "not implemented yet: replace the `raise NotImplementedError` "
                    "in your function with your code, then run this check again.",
                )
            except CheckFailure as failure:
                result = CheckResult(name, "fail", str(failure))
            except Exception as exc:  # the student's code raised: report it plainly
                result = CheckResult(
                    name, "fail", f"your function raised {type(exc).__name__}: {exc}"
                )
            if not quiet:
                print(result)
            _record(run.__name__, result)
            if not result and os.environ.get(NBGRADER_EXECUTION) in ("autograde", "validate"):
                raise CheckFailure(str(result))  # nbgrader scores the cell 0
            return result

        return run

    return decorate


def _record(check_name: str, result: CheckResult) -> None:
    path = os.environ.get(GRADING_LOG)
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"check": check_name, "status": result.status, "message": result.message}) + "\n")
