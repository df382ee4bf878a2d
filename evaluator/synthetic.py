"""A built-in synthetic task for laptops: two-digit additions ("37+48=" -> "85").

Deterministic from a seed, so the held-out set is fixed and the train stream never
contains a held-out problem.
"""

from __future__ import annotations

import random

from evaluator.data import Problem

HELDOUT_SEED = 20240205
HELDOUT_SIZE = 300


def _problem(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"{a}+{b}=", str(a + b)


def heldout(limit: int | None = None) -> list[Problem]:
    rng = random.Random(HELDOUT_SEED)
    out: list[Problem] = []
    seen: set[str] = set()
    while len(out) < min(limit or HELDOUT_SIZE, HELDOUT_SIZE):
        q, a = _problem(rng)
        if q not in seen:
            seen.add(q)
            out.append(Problem(index=len(out), question=q, gold=a))
    return out


def train(n: int, seed: int = 0) -> list[Problem]:
    """n training problems, none of them in the held-out set."""
    held = {p.question for p in heldout()}
    rng = random.Random(seed)
    out: list[Problem] = []
    while len(out) < n:
        q, a = _problem(rng)
        if q not in held:
            out.append(Problem(index=len(out), question=q, gold=a))
    return out
