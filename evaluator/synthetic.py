"""Built-in synthetic tasks for laptops (`TASKS`): two-digit additions ("37+48=" -> "85"), the same
asked in words of an instruction-tuned model with two or three digits, and two-step word problems
closer to GSM8K (`WORD_PROBLEMS`: "Ann has 37 apples. She buys 48 more and gives 19 away. How many
apples does she have now?" -> "66").

Deterministic from a seed, so the held-out set (`heldout`) is fixed and the train stream (`train`)
never contains a held-out problem. `train(..., carry_slip=p)` imitates a teacher who forgets the
carry from the units in a fraction p of the problems that need one ("37+48=" -> "75"): the demo
pipeline shows a correctness reward unlearning the slip (docs/benchmarks.md, "The demo")."""

from __future__ import annotations

import random

from evaluator.problem import Problem

HELDOUT_SEED = 20240205
HELDOUT_SIZE = 300

# task -> (lowest operand, highest operand, question format)
TASKS: dict[str, tuple[int, int, str]] = {
    "add2": (10, 99, "{a}+{b}="),  # the tiny model's task (character tokenizer, no instructions)
    "add3": (100, 999, "{a}+{b}="),  # the same, three digits: what GRPO on the tiny model does not learn yet
    "add2-words": (10, 99, "{a} + {b}"),
    "add3-words": (100, 999, "{a} + {b}"),
}


# two-step word problems: who, what, and the two steps (a gain then a loss, or a loss then a gain)
NAMES = ("Ann", "Ben", "Carla", "Dev", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kira", "Liam")
THINGS = ("apples", "stickers", "marbles", "books", "coins", "stamps", "pencils", "cards", "shells", "beads")
GAINS = ("buys {n} more", "finds {n} more", "is given {n} more", "wins {n} more")
LOSSES = ("gives {n} away", "sells {n}", "loses {n}", "uses {n}")
WORD_PROBLEMS = "twostep-words"


def _word_problem(rng: random.Random) -> tuple[str, str, list[tuple[str, int]]]:
    """A question, its answer, and its steps in order: ('+', n) or ('-', n) from the start."""
    name, things = rng.choice(NAMES), rng.choice(THINGS)
    start, gain = rng.randint(10, 99), rng.randint(10, 99)
    pronoun = "She" if name in ("Ann", "Carla", "Emma", "Grace", "Ines", "Kira") else "He"
    if rng.random() < 0.5:  # gain, then lose part of the total
        loss = rng.randint(5, start + gain - 1)
        steps = f"{rng.choice(GAINS).format(n=gain)} and then {rng.choice(LOSSES).format(n=loss)}"
        order = [("+", gain), ("-", loss)]
    else:  # lose part of the start, then gain
        loss = rng.randint(5, start - 1) if start > 5 else 1
        steps = f"{rng.choice(LOSSES).format(n=loss)} and then {rng.choice(GAINS).format(n=gain)}"
        order = [("-", loss), ("+", gain)]
    question = f"{name} has {start} {things}. {pronoun} {steps}. How many {things} does {name} have now?"
    return question, str(start + gain - loss), [("+", start), *order]


def trace(steps: list[tuple[str, int]], kind: str) -> str:
    """A worked answer a program writes for a two-step problem (never a held-out one): 'text', each
    step's arithmetic in words; 'tool', one python block, its output, then the answer (the
    code-block format of evaluator/tool_formats.py)."""
    (_, start), rest = steps[0], steps[1:]
    total, lines = start, []
    for op, n in rest:
        after = total + n if op == "+" else total - n
        lines.append(f"{total} {op} {n} = {after}.")
        total = after
    if kind == "text":
        return " ".join(lines) + f" The answer is {total}."
    from evaluator.tool_formats import FORMATS

    expr = f"{start} " + " ".join(f"{op} {n}" for op, n in rest)
    return FORMATS["code-blocks"].write_trace([(f"print({expr})", str(total))], f"The answer is {total}.")


def _problem(rng: random.Random, task: str = "add2") -> tuple[str, str]:
    return _problem_steps(rng, task)[:2]


def _problem_steps(rng: random.Random, task: str) -> tuple[str, str, list[tuple[str, int]]]:
    if task == WORD_PROBLEMS:
        return _word_problem(rng)
    low, high, fmt = TASKS[task]
    a, b = rng.randint(low, high), rng.randint(low, high)
    return fmt.format(a=a, b=b), str(a + b), [("+", a), ("+", b)]


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


def train(
    n: int, seed: int = 0, carry_slip: float = 0.0, task: str = "add2", traces: str | None = None
) -> list[Problem]:
    """n training problems, none of them in the held-out set; with `carry_slip`, that share
    of the carrying problems get the answer without the carry; with `traces` ('text' or 'tool'),
    each has a worked answer (`trace`) as its solution, what SFT imitates."""
    held = {p.question for p in heldout(task=task)}
    rng = random.Random(seed)
    slip_rng = random.Random(seed + 1)
    out: list[Problem] = []
    while len(out) < n:
        q, a, steps = _problem_steps(rng, task)
        if q not in held:
            wrong = slipped(q) if carry_slip else None
            if wrong is not None and slip_rng.random() < carry_slip:
                a = wrong
            solution = trace(steps, traces) if traces else None
            out.append(Problem(index=len(out), question=q, gold=a, solution=solution))
    return out
