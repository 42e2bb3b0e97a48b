"""Checks that exercise notebooks call, one module per chapter.

Every check takes the student's function, prints one PASS / FAIL / TODO line
and returns a truthy-on-pass :class:`~coursekit.grading.core.CheckResult`.
"""

from coursekit.grading.core import CheckFailure, CheckResult, check

__all__ = ["CheckFailure", "CheckResult", "check"]
