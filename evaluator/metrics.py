"""Score arithmetic: Wilson intervals, unbiased pass@k (Chen et al. 2021) and maj@k."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence


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
    for a, ok in zip(answers[:k], correct[:k]):
        if a is not None and votes[a] == top:
            return 1.0 if ok else 0.0
    return 0.0
