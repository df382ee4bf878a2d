"""Score arithmetic: Wilson intervals, unbiased pass@k (Chen et al. 2021), maj@k, and accuracy
broken down by a problem's subject and level."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

BREAKDOWN_KEYS = ("subject", "level")


def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a proportion (sane at 0% and 100%, unlike the normal one)."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c correct) is correct."""
    if k > n:
        raise ValueError(f"k={k} exceeds the n={n} samples drawn")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """1.0 if the most common extracted answer among the first k samples is correct.

    Ties break toward the answer seen first; samples without an answer do not vote.
    """
    votes = Counter(a for a in answers[:k] if a is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    for a, ok in zip(answers[:k], correct[:k], strict=True):
        if a is not None and votes[a] == top:
            return 1.0 if ok else 0.0
    return 0.0


def accuracy_breakdown(
    metas: Sequence[Mapping[str, Any]], correct: Sequence[bool], keys: Sequence[str] = BREAKDOWN_KEYS
) -> dict[str, tuple[int, int]]:
    """(correct, n) per group: {'accuracy/subject=Algebra': (3, 5), 'accuracy/level=2': (1, 4), ...}.

    Only problems that carry a key count towards its groups; a key no problem carries gives none.
    Groups come key by key, numbers in numeric order (level 2 before level 10), then names.
    """
    if len(metas) != len(correct):
        raise ValueError(f"{len(metas)} problems but {len(correct)} verdicts")
    out: dict[str, tuple[int, int]] = {}
    for key in keys:
        tally: dict[Any, list[int]] = {}
        for meta, ok in zip(metas, correct, strict=True):
            value = meta.get(key)
            if value is None or value == "":
                continue
            t = tally.setdefault(value, [0, 0])
            t[0] += bool(ok)
            t[1] += 1
        for value in sorted(tally, key=lambda v: (not isinstance(v, int), v if isinstance(v, int) else 0, str(v))):
            out[f"accuracy/{key}={value}"] = (tally[value][0], tally[value][1])
    return out
