"""Users' regular expressions (a regex grader's `pattern`, an `answer_pattern` of a math grader or a
recipe): every one is compiled here (`compile_pattern`) and runs on RE2 (google-re2), whose matching
takes time linear in the text, never on Python's backtracking `re`. A pattern that needs
backtracking (backreferences, lookarounds, atomic groups, possessive quantifiers) is refused when
the spec is validated, naming the field (`check`, `check_regex`). Where google-re2 is not installed
(it is the `server` extra: an SDK user's machine), `check` falls back to Python's syntax check and
the server gives the final word with a 422. RE2's character classes, and why the extra:
docs/using.md, "Graders"; RELIABILITY.md."""

from __future__ import annotations

import functools
import importlib
import re
from types import ModuleType
from typing import Any

from mathrl.errors import FieldError
from mathrl.errors import PatternError as PatternError  # raised here; its callers import it from here

BACKTRACKING = (
    "patterns run on RE2, in linear time, without backtracking: no backreferences (\\1), lookarounds "
    "((?=, (?!, (?<=, (?<!), atomic groups ((?>) or possessive quantifiers (a++); \\Z is written \\z"
)


@functools.cache
def _re2() -> ModuleType | None:
    try:
        return importlib.import_module("re2")
    except ImportError:
        return None


def _options(re2: ModuleType) -> Any:
    options = re2.Options()
    options.log_errors = False  # refusals are answered to the caller, not written to stderr
    return options


def _refusal(pattern: str, re2_error: Exception) -> PatternError:
    text = re2_error.args[0] if re2_error.args else str(re2_error)
    why = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    try:
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:  # a{99999999999}: OverflowError, not re.error
        return PatternError(f"not a regular expression: {exc}")
    if "too large" in why or "repetition size" in why:
        return PatternError(f"too large for RE2 ({why}): lower its repetition counts (at most 1000)")
    return PatternError(f"RE2 cannot run it ({why}): {BACKTRACKING}")


@functools.lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> Any:
    """The RE2 program of a user's pattern (`.search(text)`, `.groups`, as `re` has them);
    PatternError for one RE2 cannot run. Needs google-re2 (the `server` extra)."""
    re2 = _re2()
    if re2 is None:
        raise RuntimeError("grading a user's pattern needs google-re2: pip install 'mathrl[server]'")
    try:
        return re2.compile(pattern, _options(re2))
    except re2.error as exc:
        raise _refusal(pattern, exc) from None


def check(pattern: str) -> int:
    """Its number of groups, or PatternError: with RE2 where installed, else Python's syntax."""
    if _re2() is not None:
        return int(compile_pattern(pattern).groups)
    try:
        return re.compile(pattern).groups
    except (re.error, OverflowError, RecursionError) as exc:
        raise PatternError(f"not a regular expression: {exc}") from None


def check_regex(field: str, pattern: str | None, group: bool) -> None:
    """A regular expression a spec gives (with `group`: one whose group 1 is the answer), as
    RE2 runs it: a FieldError naming `field` for one it cannot run."""
    if pattern is None:
        return
    try:
        groups = check(pattern)
    except PatternError as exc:
        raise FieldError(field, str(exc)) from None
    if group and groups < 1:
        raise FieldError(field, "needs a group, e.g. '#### (\\-?[0-9.,]+)': the answer is group 1")
