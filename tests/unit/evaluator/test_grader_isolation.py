"""One project's grading cannot fail another's (issue 31, item 1): user regexes run on RE2 in
linear time (patterns that need backtracking are refused, naming the field); power towers are
refused before sympy evaluates them; each POST /v1/graders:run call grades in its own
short-lived process with a per-item limit, a deadline, a CPU budget and a per-project
concurrency limit (evaluator/bounded.py, api/routers/graders.py); GRPO rewards get the same
per-sample limit with a defined reward for a sample that overruns it (trainer/rewards.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from mathrl.graders import Grader
from tests.helpers.env import ROOT

GRADER: TypeAdapter[Any] = TypeAdapter(Grader)
BACKTRACKER = "(a+)+$"
EVIL_TEXT = "a" * 50_000 + "!"
TOWER = "\\boxed{9^{9^{9^{9}}}}"
# not a tower, and slow all the same: sympy computes the binomial (seconds of CPU, in C)
SLOW = "\\boxed{\\binom{10^{7}}{5000000}}"


def _in_a_subprocess(code: str, timeout: float) -> str:
    """Run `code` in a fresh interpreter (a catastrophic regex cannot be interrupted in this one)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout:g} s")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.quick
def test_user_patterns_run_in_linear_time() -> None:
    """A regex grader's pattern, a math grader's answer_pattern and a recipe's answer_pattern
    (evaluator.grading.grade) on 50,000 'a' and a '!': Python's backtracking engine takes
    exponential time on `(a+)+$`; RE2 answers in milliseconds."""
    out = _in_a_subprocess(
        f"""
        import time
        from pydantic import TypeAdapter
        from evaluator.graders import grade_items
        from evaluator.grading import grade
        from mathrl.graders import Grader
        text = {EVIL_TEXT!r}
        g = TypeAdapter(Grader).validate_python
        t = time.perf_counter()
        r = grade_items(g({{"type": "regex", "pattern": {BACKTRACKER!r}}}), [text], [None])
        m = grade_items(g({{"type": "math", "answer_pattern": "((a+)+)$"}}), [text], ["1"])
        v = grade(text, "1", pattern="((a+)+)$")
        print(r[0].score, m[0].score, v.extracted, round(time.perf_counter() - t, 3))
        """,
        timeout=30,
    )
    print(out)
    regex, math, extracted, seconds = out.split()
    assert (regex, math, extracted) == ("0.0", "0.0", "None")
    assert float(seconds) < 1.0


@pytest.mark.quick
@pytest.mark.parametrize(
    ("pattern", "says"),
    [("(\\w)\\1", "\\1"), ("(?=a)b", "(?="), ("(?<!x)y", "(?<!"), ("(?>a)", "(?>"), ("a++", "++")],
)
def test_patterns_that_need_backtracking_are_refused_naming_the_field(pattern: str, says: str) -> None:
    from mathrl.recipe import Recipe

    for body, field in [
        ({"type": "regex", "pattern": pattern}, "pattern"),
        ({"type": "math", "answer_pattern": f"(\\d+){pattern}"}, "answer_pattern"),
    ]:
        with pytest.raises(ValidationError) as err:
            GRADER.validate_python(body)
        message = str(err.value)
        assert "backtracking" in message and says in message, (field, message)
    with pytest.raises(ValidationError, match="backtracking"):
        Recipe.model_validate({"question": "{question}", "answer_pattern": f"(\\d+){pattern}"})


@pytest.mark.quick
def test_without_google_re2_the_sdk_checks_syntax_and_never_grades_on_re(monkeypatch: pytest.MonkeyPatch) -> None:
    """google-re2 is in the server extra: an SDK-only install checks Python's syntax (the server
    refuses what RE2 cannot run), and grading without it is an error, never a run on `re`."""
    import mathrl.regex

    monkeypatch.setattr(mathrl.regex, "_re2", lambda: None)
    assert mathrl.regex.check("(a)\\1 never seen") == 1
    with pytest.raises(mathrl.regex.PatternError, match="not a regular expression"):
        mathrl.regex.check("(unclosed")
    with pytest.raises(RuntimeError, match="google-re2"):
        mathrl.regex.compile_pattern("(a)b never seen")


@pytest.mark.quick
def test_graders_run_refuses_a_backtracking_pattern_with_422(app_client: Any) -> None:
    from tests.helpers.api import admin_key

    body = {"grader": {"type": "regex", "pattern": "(a)\\1"}, "items": [{"completion": "aa"}]}
    r = app_client.post("/v1/graders:run", json=body, headers=admin_key(app_client))
    assert r.status_code == 422, r.text
    error = r.json()["errors"][0]
    assert error["pointer"] == "/grader/pattern" and "backtracking" in error["detail"], error


@pytest.mark.quick
def test_power_towers_are_refused_before_sympy_evaluates_them() -> None:
    """`\\boxed{9^{9^{9^{9}}}}` (96 bytes) took 6.9 s in the route, and longer than the step in a
    rollout thread (no alarm there): now a defined 0 at once, with the reason."""
    from evaluator.graders import grade_items
    from evaluator.grading import answers_match

    math = GRADER.validate_python({"type": "math"})
    assert grade_items(math, ["\\boxed{2^{10}}"], ["1024"])[0].score == 1.0  # the parser loaded, as in a grader
    t = time.perf_counter()
    r = grade_items(math, [f"so {TOWER}", "\\boxed{2^{10}}"], ["1", "1024"])
    tower = time.perf_counter() - t
    print(f"a tower and a plain power: {tower:.3f} s; {r[0].reason}")
    assert [x.score for x in r] == [0.0, 1.0]
    assert "not evaluated" in r[0].reason and "digits" in r[0].reason
    t = time.perf_counter()
    many = grade_items(math, [f"{TOWER} {i}" for i in range(200)], ["1"] * 200)  # 29 KB of towers
    assert all(x.score == 0.0 for x in many)
    for gold in ["10^{10^{10}}", "(9^9)^{9^9}", "x^{9^{9}}", "9^{-9^{9}}", "(10^{6})!"]:  # as a gold answer too
        assert answers_match("3", gold) is False
    seconds = time.perf_counter() - t
    print(f"200 towers and 5 golds: {seconds:.3f} s")
    assert tower < 1.0 and seconds < 5.0


def _in_a_thread(fn: Any, timeout: float) -> Any:
    """`fn()` in a thread, as async GRPO scores rewards (no signal.alarm there)."""
    box: list[Any] = []
    worker = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        pytest.fail(f"the reward call was still running after {timeout:g} s")
    return box[0]


@pytest.mark.quick
def test_a_reward_on_an_adversarial_completion_is_cut_off_with_a_defined_reward() -> None:
    """A sample whose check overruns `item_seconds` gets the reward of a wrong answer, is
    counted, and the others in the call are scored as usual."""
    from trainer.rewards import get_reward

    completions = ["\\boxed{42}", f"so {SLOW}", "\\boxed{41}", "#### 42"]
    golds = ["42"] * 4
    accuracy = get_reward("accuracy", item_seconds=1.0)
    binary = get_reward("binary", item_seconds=1.0)
    grader = get_reward("grader", grader=GRADER.validate_python({"type": "math"}), item_seconds=1.0)
    for reward, expected in [(accuracy, [1.0, 0.0, 0.0, 1.0]), (binary, [1.0, -1.0, -1.0, 1.0])]:
        t = time.perf_counter()
        assert _in_a_thread(lambda r=reward: r(completions, answer=golds), 20) == expected
        print(f"{reward.__name__}: {time.perf_counter() - t:.2f} s")
        assert reward.timed_out == 1
    assert _in_a_thread(lambda: grader(completions, answer=golds), 20) == [1.0, 0.0, 0.0, 1.0]
    assert grader.timed_out == 1
    assert _in_a_thread(lambda: accuracy([TOWER], answer=["1"]), 5) == [0.0]  # refused, not timed out
    assert accuracy.timed_out == 1


@pytest.mark.quick
def test_timed_out_samples_are_logged_as_a_metric() -> None:
    from types import SimpleNamespace

    from trainer.callbacks import SinkCallback

    logged: list[dict[str, float]] = []
    sink = SimpleNamespace(metrics=lambda step, values: logged.append(values))
    callback = SinkCallback(sink)  # type: ignore[arg-type]
    callback.rewards = [SimpleNamespace(__name__="accuracy", timed_out=2), SimpleNamespace(__name__="x", timed_out=0)]
    callback.on_log(SimpleNamespace(), SimpleNamespace(global_step=3), SimpleNamespace(), logs={"loss": 1.0})
    assert logged[-1]["rewards/accuracy/timed_out"] == 2.0 and "rewards/x/timed_out" not in logged[-1]
    assert logged[-1]["reward/timeouts"] == 2.0  # every reward's, in one series


@pytest.mark.quick
def test_a_call_is_stopped_at_its_deadline_and_cpu_budget() -> None:
    from evaluator.bounded import TIMED_OUT, run_bounded
    from evaluator.grading import check_answers

    items = [("1", "1"), (SLOW.removeprefix("\\boxed{").removesuffix("}"), "1"), ("2", "2")]
    t = time.perf_counter()
    batch = run_bounded(check_answers, items, item_seconds=1.0)
    print(f"per item: {time.perf_counter() - t:.2f} s")
    assert [o.error for o in batch.outcomes] == [None, TIMED_OUT, None] and batch.timed_out == 1
    assert batch.outcomes[0].value[0] is True and batch.stopped is None
    t = time.perf_counter()
    batch = run_bounded(check_answers, items, item_seconds=30.0, cpu_seconds=1.0)
    print(f"cpu: {time.perf_counter() - t:.2f} s")
    assert batch.stopped == "cpu" and batch.outcomes[0].error is None and batch.outcomes[2].error == "cpu"
    assert time.perf_counter() - t < 10
    t = time.perf_counter()
    batch = run_bounded(check_answers, items, item_seconds=30.0, deadline_seconds=1.5)
    assert batch.stopped == "deadline" and time.perf_counter() - t < 5


# --- against a real API process -------------------------------------------------------------
