"""Built-in synthetic tasks for laptops: two-digit additions ("37+48=" -> "85"), and the same
asked in words of an instruction-tuned model ("37 + 48" under the prompt "What is {question}?
Give the final answer as a number."), with two or three digits (`TASKS`).

Deterministic from a seed, so the held-out set is fixed and the train stream never
contains a held-out problem.

`train(..., carry_slip=p)` imitates imperfect demonstrations: a teacher who forgets the
carry from the units in a fraction p of the problems that need one ("37+48=" -> "75").
A model fine-tuned on them learns the slip; a correctness reward, which checks the true
sum, can unlearn it. The demo pipeline uses this to show what RL adds over imitation.
"""

from __future__ import annotations

import random

from evaluator.problem import Problem

HELDOUT_SEED = 20240205
HELDOUT_SIZE = 300

# task -> (lowest operand, highest operand, question format)
TASKS: dict[str, tuple[int, int, str]] = {
    "add2": (10, 99, "{a}+{b}="),  # the tiny model's task (character tokenizer, no instructions)
    "add2-words": (10, 99, "{a} + {b}"),
    "add3-words": (100, 999, "{a} + {b}"),
}


def _problem(rng: random.Random, task: str = "add2") -> tuple[str, str]:
    low, high, fmt = TASKS[task]
    a, b = rng.randint(low, high), rng.randint(low, high)
    return fmt.format(a=a, b=b), str(a + b)


def heldout(limit: int | None = None, task: str = "add2") -> list[Problem]:
    rng = random.Random(HELDOUT_SEED)
    out: list[Problem] = []
    seen: set[str] = set()
    while len(out) < min(limit or HELDOUT_SIZE, HELDOUT_SIZE):
        q, a = _problem(rng, task)
        if q not in seen:
            seen.add(q)
            out.append(Problem(index=len(out), question=q, gold=a))
    return out


def slipped(question: str) -> str | None:
    """The answer with the carry from the units forgotten, or None if no carry is needed."""
    a, b = (int(x) for x in question.rstrip("=").replace(" ", "").split("+"))
    if a % 10 + b % 10 < 10:
        return None
    return str(a + b - 10)


def train(n: int, seed: int = 0, carry_slip: float = 0.0, task: str = "add2") -> list[Problem]:
    """n training problems, none of them in the held-out set; with `carry_slip`, that share
    of the carrying problems get the answer without the carry."""
    held = {p.question for p in heldout(task=task)}
    rng = random.Random(seed)
    slip_rng = random.Random(seed + 1)
    out: list[Problem] = []
    while len(out) < n:
        q, a = _problem(rng, task)
        if q not in held:
            wrong = slipped(q)
            if carry_slip and wrong is not None and slip_rng.random() < carry_slip:
                a = wrong
            out.append(Problem(index=len(out), question=q, gold=a))
    return out
