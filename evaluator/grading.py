"""Answer extraction and checking.

Extraction finds the final answer text in a completion (GSM8K '#### n', the last
\\boxed{...}, 'the answer is ...', else the last number); math-verify decides whether it
equals the gold answer (fractions, decimals, percentages, sets, intervals, matrices...).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

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
TIMEOUT_SECONDS = 5


def _timeout() -> int | None:
    """math-verify's timeouts use signal.alarm, which only the main thread may set: elsewhere
    (async GRPO scores rewards in a rollout thread) it runs without one, as math-verify advises."""
    return TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None


def _parse_answer(text: str) -> list[object]:
    """math-verify parse of a bare answer: try it as LaTeX first, then as a plain expression."""
    stripped = text.strip()
    wrapped = stripped if stripped.startswith("$") else f"${stripped}$"
    parsed = parse(wrapped, extraction_config=_GOLD_CFG, parsing_timeout=_timeout())
    if not parsed:
        parsed = parse(stripped, extraction_config=_GOLD_CFG, parsing_timeout=_timeout())
    return parsed


def answers_match(predicted: str, gold: str) -> bool:
    """True when math-verify finds the two answers equal."""
    gold_parsed = _parse_answer(gold)
    pred_parsed = _parse_answer(predicted)
    if not gold_parsed or not pred_parsed:
        return predicted.strip() == gold.strip()
    try:
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=_timeout()))
    except Exception:  # math-verify raises on pathological input; that is a wrong answer
        return False


@dataclass
class Verdict:
    extracted: str | None
    correct: bool
    method: str | None = None  # one of METHODS: how `extracted` was found


def grade(completion: str, gold: str, pattern: str | None = None, truncated: bool = False) -> Verdict:
    """`pattern`: a recipe's answer_pattern; the answer is its first match's group 1 (as
    lm-evaluation-harness's strict-match), else nothing; unset: `extract` (no last-number
    fallback for a `truncated` completion)."""
    if pattern is not None:
        m = re.search(pattern, completion)
        found = (m.group(1) or "").strip() if m else ""
        # a number as lm-eval reads it ('1,234.' -> '1234'); anything else as written
        extracted = (_clean_number(found) if re.fullmatch(r"[-$\d.,]+", found) else found) or None
        method = "pattern" if extracted is not None else None
    else:
        extracted, method = extract(completion, truncated)
    if extracted is None:
        return Verdict(None, False)
    return Verdict(extracted, answers_match(extracted, gold), method)
