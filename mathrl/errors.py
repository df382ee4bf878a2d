"""Errors the SDK's own checks raise, importable by every module that raises them."""

from __future__ import annotations

from mathrl.regex import PatternError, check


class FieldError(ValueError):
    """A cross-field error that knows which field to blame (the API's problem details point at it)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def check_regex(field: str, pattern: str | None, group: bool) -> None:
    """A regular expression a spec gives (with `group`: one whose group 1 is the answer), as
    RE2 runs it (mathrl/regex.py: patterns that need backtracking are refused)."""
    if pattern is None:
        return
    try:
        groups = check(pattern)
    except PatternError as exc:
        raise FieldError(field, str(exc)) from None
    if group and groups < 1:
        raise FieldError(field, "needs a group, e.g. '#### (\\-?[0-9.,]+)': the answer is group 1")
