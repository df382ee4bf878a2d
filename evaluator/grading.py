"""Answer extraction and checking.

Extraction finds the final answer text in a completion (GSM8K '#### n', the last
\\boxed{...}, 'the answer is ...', else the last number); math-verify decides whether it
equals the gold answer (fractions, decimals, percentages, sets, intervals, matrices...).
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass
from typing import Any

import sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from mathrl.errors import MathRLException
from mathrl.regex import compile_pattern

_HASH = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*\$?([^\n$]+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        # "\boxed 5" form
        m = re.match(r"\\boxed\s+([^\s$]+)", text[start:])
        return m.group(1) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def gsm8k_gold(answer_field: str) -> str:
    """The number after '####' in a GSM8K worked solution."""
    m = _HASH.search(answer_field)
    if not m:
        raise ValueError(f"GSM8K answer has no '####' line: {answer_field[-80:]!r}")
    return m.group(1).strip().replace(",", "")


def _clean_number(s: str) -> str:
    return s.replace("$", "").replace(",", "").strip().rstrip(".")


METHODS = ("pattern", "boxed", "####", "answer-is", "last-number")  # how an answer was found
_LEADING_NUMBER = re.compile(r"^-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?=$|[\s*%)]|\.(?:\s|$)|[a-zA-Z])")


def normalise(answer: str) -> str | None:
    """The answer itself, not the phrase around it ('####' lines, 'the answer is ...'; a \\boxed{}
    answer is taken as written): after the last '=' ('100 + 150 = 250' ->
    '250'), a number without '$', ',' or a trailing '.', or its leading number when words
    follow ('18 dollars' -> '18', '18** per day' -> '18'); otherwise the expression as written
    (LaTeX, sets, intervals: math-verify reads those)."""
    text = answer.strip().strip("*").strip()
    if "=" in text and "\\" not in text and "\\begin" not in text:
        text = text.rsplit("=", 1)[1].strip()
    text = text.rstrip(".").strip()
    if _NUMBER.fullmatch(text):
        return _clean_number(text) or None
    m = _LEADING_NUMBER.match(text)
    if m:
        return _clean_number(m.group(0)) or None
    return text or None


def extract(completion: str, truncated: bool = False) -> tuple[str | None, str | None]:
    """The normalised final answer of a completion and how it was found ('boxed', '####',
    'answer-is', 'last-number'), or (None, None). A truncated completion gets no last-number
    fallback: a number it happened to reach before the limit is not its answer."""
    boxed = last_boxed(completion)
    if boxed is not None and boxed.strip():
        return boxed.strip(), "boxed"
    hashes = _HASH.findall(completion)
    if hashes:
        found = normalise(hashes[-1])
        if found:
            return found, "####"
    said = _ANSWER_IS.findall(completion)
    if said:
        found = normalise(said[-1])
        if found:
            return found, "answer-is"
    if not truncated:
        numbers = _NUMBER.findall(completion)
        if numbers:
            return _clean_number(numbers[-1]), "last-number"
    return None, None


def extract_answer(completion: str, truncated: bool = False) -> str | None:
    """The final answer text of a completion, or None when it gives none (see `extract`)."""
    return extract(completion, truncated)[0]


_GOLD_CFG = (LatexExtractionConfig(), ExprExtractionConfig())
TIMEOUT_SECONDS: int | None = 5  # None in evaluator/bounded.py's processes: the hard per-item limit is the bound


def _timeout() -> int | None:
    """math-verify's timeouts use signal.alarm, which only the main thread may set: elsewhere
    (async GRPO scores rewards in a rollout thread) it runs without one, as math-verify advises."""
    return TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None


def without_alarms() -> None:
    """For a process its supervisor kills at its limits (evaluator/bounded.py): math-verify with
    no signal.alarm timeouts, and without its warning that they are off."""
    global TIMEOUT_SECONDS
    TIMEOUT_SECONDS = None
    import math_verify.grader
    import math_verify.parser

    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True


def _parse_answer(text: str) -> list[object]:
    """math-verify parse of a bare answer: try it as LaTeX first, then as a plain expression."""
    stripped = text.strip()
    wrapped = stripped if stripped.startswith("$") else f"${stripped}$"
    parsed: list[object] = parse(wrapped, extraction_config=_GOLD_CFG, parsing_timeout=_timeout())
    if not parsed:
        parsed = parse(stripped, extraction_config=_GOLD_CFG, parsing_timeout=_timeout())
    return parsed


# two bare integers (the arithmetic sets' answers, most of GSM8K's) are compared as integers: math-verify
# parses each through sympy, 1.2 ms a pair, which was a fifth of the demo's GRPO steps and labelling. ASCII
# digits only: int() also reads '٣' or '３' as 3, where math-verify parses nothing and the answers differ
_PLAIN_INTEGER = re.compile(r"-?[0-9]{1,1000}")
MAX_DIGITS = 100_000  # an answer with a number past this many digits is not evaluated (no answer is that long)


class _TooBig(MathRLException):
    """An answer too large to evaluate (private: caught in this module, where it is raised)."""


def _log10(n: int) -> float:
    return math.log10(abs(n)) if n else 0.0


def _power(mag_base: float, size_base: float, mag_exp: float) -> tuple[float, float]:
    """log10 |b^x| (an upper bound) and the digits sympy would compute it to, from those of b and x."""
    times = math.inf if mag_exp > 300 else 10.0**mag_exp  # |x|, at most
    return (times * abs(mag_base) if mag_base else 0.0), (times * size_base if size_base else 0.0)


def _estimate(e: Any, depth: int = 0) -> tuple[float, float]:
    """(an upper bound on log10 |e|, the digits of its exact value) for a parsed answer, without
    evaluating it; _TooBig where either passes MAX_DIGITS anywhere inside. A free symbol counts as
    10; a call (sin, log, a set...) as the largest of its arguments."""
    if depth > 400:
        raise _TooBig("it is nested over 400 levels deep")
    if isinstance(e, sympy.MatrixBase) and not isinstance(e, sympy.Basic):  # a mutable matrix: its entries
        e = sympy.Tuple(*e)
    if not isinstance(e, sympy.Basic):
        return 0.0, 0.0
    if isinstance(e, sympy.Integer):
        mag = _log10(int(e.p))
        out = mag, mag
    elif isinstance(e, sympy.Rational):
        out = _log10(int(e.p)) - _log10(int(e.q)), max(_log10(int(e.p)), _log10(int(e.q)))
    elif isinstance(e, sympy.Float):
        _, man, exp, bc = e._mpf_
        out = (((exp + bc) * math.log10(2)) if man else 0.0), 0.0
    elif isinstance(e, (sympy.NumberSymbol, sympy.core.numbers.ImaginaryUnit)):
        out = 0.5, 0.0
    elif isinstance(e, sympy.Symbol):
        out = 1.0, 1.0
    else:
        parts = [_estimate(a, depth + 1) for a in e.args]
        mags, sizes = [m for m, _ in parts] or [0.0], [s for _, s in parts] or [0.0]
        if isinstance(e, sympy.Pow):
            out = _power(mags[0], sizes[0], mags[1])
        elif isinstance(e, sympy.exp):  # e^x: kept symbolic, so only its magnitude counts
            out = _power(math.log10(math.e), 0.0, mags[0])
        elif isinstance(e, sympy.Mul):
            out = sum(mags), sum(sizes)
        elif isinstance(e, sympy.Add):
            out = max(mags) + math.log10(len(mags)), sum(sizes)
        elif isinstance(e, (sympy.factorial, sympy.factorial2, sympy.gamma, sympy.subfactorial)):
            n = math.inf if mags[0] > 300 else 10.0 ** mags[0]
            digits = n * math.log10(n) if n > 1 else 0.0
            out = digits, digits
        elif isinstance(e, sympy.binomial):
            digits = (math.inf if mags[0] > 300 else 10.0 ** mags[0]) * math.log10(2)
            out = digits, digits
        else:
            out = max(mags), max(sizes)
    if not (out[0] <= MAX_DIGITS and out[1] <= MAX_DIGITS):  # inf and nan too
        digits = max(out)
        raise _TooBig(
            f"it holds a number of about {digits:.2g} digits (the limit is {MAX_DIGITS:,})"
            if math.isfinite(digits)
            else "it holds a number with too many digits to count (a power tower)"
        )
    return out


def too_big(parsed: list[object]) -> str | None:
    """Why a parsed answer is not evaluated (a power tower, a huge exponent or factorial: sympy
    would compute every digit, for seconds or for ever), or None."""
    try:
        for e in parsed:
            _estimate(e)
    except _TooBig as exc:
        return str(exc)
    except RecursionError:
        return "it is nested too deeply"
    return None


def check_answers(predicted: str, gold: str) -> tuple[bool, str | None]:
    """(whether math-verify finds the two answers equal, a note when they were not compared: one
    of them is too big to evaluate). Module-level and of plain data: evaluator/bounded.py runs it
    in a child process."""
    if _PLAIN_INTEGER.fullmatch(a := predicted.strip()) and _PLAIN_INTEGER.fullmatch(b := gold.strip()):
        return int(a) == int(b), None  # what verify_answers finds for two integers, ~1000x sooner
    return verify_answers(predicted, gold)


def verify_answers(predicted: str, gold: str) -> tuple[bool, str | None]:
    """check_answers through math-verify for every pair (two unparsed answers: equal as written)."""
    gold_parsed = _parse_answer(gold)
    pred_parsed = _parse_answer(predicted)
    for which, parsed in (("the answer", pred_parsed), ("the gold answer", gold_parsed)):
        why = too_big(parsed)
        if why is not None:
            return False, f"not evaluated: {which}: {why}"
    if not gold_parsed or not pred_parsed:
        return predicted.strip() == gold.strip(), None
    try:
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=_timeout())), None
    except Exception:  # math-verify raises on pathological input; that is a wrong answer
        return False, None


def answers_match(predicted: str, gold: str) -> bool:
    """True when math-verify finds the two answers equal."""
    return check_answers(predicted, gold)[0]


@dataclass
class Verdict:
    extracted: str | None
    correct: bool
    method: str | None = None  # one of METHODS: how `extracted` was found
    note: str | None = None  # why it was not compared (check_answers)


def find_answer(completion: str, pattern: str | None = None, truncated: bool = False) -> tuple[str | None, str | None]:
    """The answer `grade` checks and how it was found: with `pattern` (run on RE2, as every user's
    pattern is: mathrl/regex.py) its first match's group 1, else `extract`."""
    if pattern is None:
        return extract(completion, truncated)
    m = compile_pattern(pattern).search(completion)
    found = (m.group(1) or "").strip() if m else ""
    # a number as lm-eval reads it ('1,234.' -> '1234'); anything else as written
    extracted = (_clean_number(found) if re.fullmatch(r"[-$\d.,]+", found) else found) or None
    return extracted, ("pattern" if extracted is not None else None)


def grade(completion: str, gold: str, pattern: str | None = None, truncated: bool = False) -> Verdict:
    """`pattern`: a recipe's answer_pattern; the answer is its first match's group 1 (as
    lm-evaluation-harness's strict-match), else nothing; unset: `extract` (no last-number
    fallback for a `truncated` completion)."""
    extracted, method = find_answer(completion, pattern, truncated)
    if extracted is None:
        return Verdict(None, False)
    correct, note = check_answers(extracted, gold)
    return Verdict(extracted, correct, method, note)
