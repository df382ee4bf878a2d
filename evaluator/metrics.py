"""Score arithmetic: Wilson intervals, unbiased pass@k (Chen et al. 2021), maj@k, and accuracy
broken down by a problem's subject and level."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
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


def maj_at_k(
    answers: Sequence[str | None],
    correct: Sequence[bool],
    k: int,
    same: Callable[[str, str], bool] | None = None,
) -> float:
    """1.0 if the most common extracted answer among the first k samples is correct.

    With `same` (the grader's equivalence, e.g. math-verify), answers vote as groups of equal
    answers ('0.5' and '\\frac{1}{2}' are one vote), else as exact strings. Ties break toward the
    group seen first; samples without an answer do not vote.
    """
    groups: list[list[int]] = []  # indices of the samples in each group, in order of first sight
    for i, a in enumerate(answers[:k]):
        if a is None:
            continue
        for g in groups:
            rep = answers[g[0]]
            assert rep is not None
            if a == rep or (same is not None and same(a, rep)):
                g.append(i)
                break
        else:
            groups.append([i])
    if not groups:
        return 0.0
    top = max(groups, key=len)  # max keeps the first of equal sizes
    return 1.0 if correct[top[0]] else 0.0


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
