"""What a python grader's sandbox (evaluator/sandbox.py) or a grading pool wrote, read as one
`CaseResult` per case and never trusted: the user's code holds the result pipe, and can write to it
past the harness's own checks."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any


@dataclass
class CaseResult:
    score: float | None = None
    error: str | None = None  # 'runtime' (the user's code raised) or 'server' (the sandbox stopped it)
    detail: str | None = None


NOT_FINITE = "the grader wrote a score that is not a finite number"
CASE_ERRORS = ("runtime", "server")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{NOT_FINITE} ({name})")


def _unreadable(e: ValueError, n: int, otherwise: str) -> list[CaseResult]:
    """Results that are no JSON: NaN or Infinity (written to the result pipe past the harness) are
    the grader's error; anything else, the sandbox's."""
    if str(e).startswith(NOT_FINITE):
        return [CaseResult(error="runtime", detail=f"{e}: a score is a finite number")] * n
    return [CaseResult(error="server", detail=otherwise)] * n


def read_results(data: str | bytes, n: int, nothing: str, key: str | None = None) -> list[CaseResult]:
    """The JSON `data` (its `key` where it is an object: a pool's answer) read as `n` results; `nothing`:
    what a sandbox error says where it is no JSON."""
    try:
        rows = json.loads(data, parse_constant=_no_constant)
    except ValueError as e:
        return _unreadable(e, n, nothing)
    return checked_results(rows.get(key) if key is not None and isinstance(rows, dict) else rows, n)


def checked_results(rows: Any, n: int) -> list[CaseResult]:
    """What the sandbox (or a grading pool) wrote, read as `n` results and never trusted: the user's
    code holds the result pipe, and can write to it past the harness's own checks. A score that is
    not a finite number, a row of another shape, or another count of rows is the grader's error."""
    if not isinstance(rows, list) or len(rows) != n:
        got = f"{len(rows)} results" if isinstance(rows, list) else type(rows).__name__
        return [CaseResult(error="runtime", detail=f"the grader wrote {got} for {n} cases")] * n
    return [_checked(row) for row in rows]


def _checked(row: Any) -> CaseResult:
    if not isinstance(row, dict):
        return CaseResult(error="runtime", detail=f"the grader wrote a {type(row).__name__} as a case's result")
    score, error, detail = row.get("score"), row.get("error"), row.get("detail")
    detail = detail[-4000:] if isinstance(detail, str) else None
    if error is not None:
        return CaseResult(error=error if error in CASE_ERRORS else "runtime", detail=detail or str(error)[:200])
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        return CaseResult(error="runtime", detail=f"grade() returned {score!r:.80}, not a finite number")
    return CaseResult(float(score))
