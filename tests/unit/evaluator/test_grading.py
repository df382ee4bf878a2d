"""Answer extraction and math-verify grading on real answer formats, and score arithmetic."""

from __future__ import annotations

import math

import pytest

from evaluator.grading import extract, extract_answer, grade, gsm8k_gold, last_boxed
from evaluator.metrics import maj_at_k, pass_at_k, wilson_interval

pytestmark = pytest.mark.quick

# (completion, gold, expected verdict)
CASES: list[tuple[str, str, bool]] = [
    # fractions
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
    ("\\boxed{1/2}", "\\frac{1}{2}", True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac34", True),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", True),
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", False),
    # units and text
    ("\\boxed{5\\text{ cm}}", "5", True),
    ("\\boxed{\\text{(B)}}", "\\text{(B)}", True),
    ("\\boxed{12 \\text{ dollars}}", "12", True),
    # percentages
    ("The answer is 25%.", "25", True),
    ("\\boxed{25\\%}", "25", True),
    # thousands separators
    ("#### 1,234", "1234", True),
    ("\\boxed{1,000,000}", "1000000", True),
    ("The total is $2,500.", "2500", True),
    # negative numbers
    ("\\boxed{-3}", "-3", True),
    ("\\boxed{-3}", "3", False),
    ("#### -12", "-12", True),
    # intervals
    ("\\boxed{[2, 5)}", "[2,5)", True),
    ("\\boxed{(-\\infty, 3]}", "(-\\infty,3]", True),
    ("\\boxed{[2, 5]}", "[2,5)", False),
    # tuples
    ("\\boxed{(1, 2)}", "(1,2)", True),
    ("\\boxed{(2, 1)}", "(1,2)", False),
    # matrices
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 3 \\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", False),
    # degrees
    ("\\boxed{90^\\circ}", "90", True),
    ("\\boxed{45^{\\circ}}", "45^\\circ", True),
    # multiple answers
    ("\\boxed{2, 3}", "3, 2", True),
    ("\\boxed{x = 2 \\text{ or } x = 3}", "2, 3", True),
    ("\\boxed{2}", "2, 3", False),
    # no box
    ("Adding them gives 18 eggs.", "18", True),
    ("The final answer is 7", "7", True),
    ("#### 72", "72", True),
    ("So she has 10 left.", "9", False),
    ("I cannot solve this.", "9", False),
    # radicals, pi, expressions
    ("\\boxed{2\\sqrt{3}}", "2\\sqrt{3}", True),
    ("\\boxed{\\sqrt{12}}", "2\\sqrt{3}", True),
    ("\\boxed{3\\pi}", "3\\pi", True),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
    ("\\boxed{x = 5}", "5", True),
    ("\\boxed{5.00}", "5", True),
    # nested braces and the last box wins
    ("first \\boxed{3} then corrected: \\boxed{\\frac{7}{2}}", "3.5", True),
    ("\\boxed{10}", "10.5", False),
]


@pytest.mark.parametrize(("completion", "gold", "expected"), CASES)
def test_grading(completion: str, gold: str, expected: bool) -> None:
    assert grade(completion, gold).correct is expected


def test_extraction() -> None:
    assert last_boxed("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{a{b}c}") == "a{b}c"
    assert extract_answer("blah\n#### 1,234\n") == "1234"
    assert extract_answer("no digits here") is None
    assert gsm8k_gold("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72") == "72"


def test_pass_at_k_unbiased_estimator() -> None:
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 10, 5) == 1.0
    assert math.isclose(pass_at_k(10, 3, 1), 0.3)
    # 1 - C(7,2)/C(10,2) = 1 - 21/45
    assert math.isclose(pass_at_k(10, 3, 2), 1 - 21 / 45)
    assert pass_at_k(4, 1, 4) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_maj_at_k() -> None:
    answers = ["5", "6", "5", None, "6", "6"]
    correct = [True, False, True, False, False, False]
    assert maj_at_k(answers, correct, 3) == 1.0  # 5 wins 2-1
    assert maj_at_k(answers, correct, 6) == 0.0  # 6 wins 3-2
    assert maj_at_k(["5", "6"], [True, False], 2) == 1.0  # tie: first seen
    assert maj_at_k([None, None], [False, False], 2) == 0.0


def test_wilson_interval() -> None:
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and 0.25 < high < 0.35
    low, high = wilson_interval(50, 100)
    assert math.isclose(low, 0.4038, abs_tol=1e-3) and math.isclose(high, 0.5962, abs_tol=1e-3)


def test_grading_works_off_the_main_thread() -> None:
    """Async GRPO scores rewards in a rollout thread; math-verify's signal-based timeout cannot
    run there (it raised 'signal only works in main thread' and stopped the rollouts)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(grade, "so the answer is \\boxed{\\frac{1}{2}}", "0.5").result().correct


@pytest.mark.parametrize(
    ("completion", "truncated", "answer", "method"),
    [
        # the phrase after 'the answer is' is not the answer; what it equals is
        ("So the answer is 100 + 150 = 250.", False, "250", "answer-is"),
        ("The answer is 18 dollars.", False, "18", "answer-is"),
        # '####' stops at the number, not at the end of the markdown line
        ("She makes $18.\n#### 18** per day\n\n**Next", False, "18", "####"),
        ("#### 1,234.", False, "1234", "####"),
        ("\\boxed{\\frac{1}{2}}", False, "\\frac{1}{2}", "boxed"),
        ("\\boxed{x = 2 \\text{ or } x = 3}", False, "x = 2 \\text{ or } x = 3", "boxed"),
        ("She sells 9 eggs for 2 each, 18 in all", False, "18", "last-number"),
        # cut off mid-sum: the number it reached is not an answer, so 'no answer' is reachable
        ("She lays 16 x 3 = <<16*3=54>>54 ducks.\nShe lays 16 x 3 = <<16", True, None, None),
        ("no digits here", False, None, None),
    ],
)
def test_extraction_says_what_it_found(
    completion: str, truncated: bool, answer: str | None, method: str | None
) -> None:
    assert extract(completion, truncated) == (answer, method)


def test_binary_reward_gives_no_answer_to_a_cut_off_completion() -> None:
    from trainer.rewards import get_reward

    binary = get_reward("binary", max_length=4)
    texts = ["16 x 3 = <<16", "16 x 3 = 48"]
    assert binary(texts, answer=["48", "48"], completion_ids=[[1, 2, 3, 4], [1, 2, 3]]) == [-0.5, 1.0]


def test_maj_at_k_groups_equal_answers() -> None:
    from evaluator.grading import answers_match

    answers = ["0.5", "3", "\\frac{1}{2}", "3", "1/2"]
    correct = [True, False, True, False, True]
    assert maj_at_k(answers, correct, 5) == 0.0  # as strings: '3' wins 2-1-1-1
    assert maj_at_k(answers, correct, 5, same=answers_match) == 1.0  # one half: 3 votes to 2


def test_two_bare_integers_are_compared_as_math_verify_compares_them() -> None:
    """check_answers compares two bare integers itself (math-verify took 1.2 ms a pair through sympy,
    a fifth of the demo's GRPO steps): the verdict must be math-verify's, leading zeros, signs and
    big numbers included; anything else still goes to math-verify."""
    import itertools

    from evaluator.grading import check_answers, verify_answers

    values = ["0", "00", "-0", "7", "07", "-7", "-07", "12", "012", "120", "198", "99999999999999999999",
              "099999999999999999999", "10" * 40, "-" + "10" * 40, " 12 ", "12\n",
              "٣", "３", "١٢", "𝟑"]  # other scripts' digits, which int() reads and math-verify does not  # fmt: skip
    for a, b in itertools.product(values, values):
        assert check_answers(a, b) == verify_answers(a, b), (a, b)
    assert check_answers("12.0", "12") == (True, None) and check_answers("1,234", "1234") == (True, None)
    assert check_answers("+12", "12") == (True, None) and check_answers("12", "13") == (False, None)
