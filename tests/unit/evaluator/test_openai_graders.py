"""OpenAI's grader JSON (string_check, text_similarity, python, multi) as mathrl graders: each
type's score against the library it names, templates, the multi formula, the python sandbox's
limits, and POST /v1/fine_tuning/alpha/graders/run and /validate through the real `openai`
package (docs/openai-rft.md)."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from evaluator.graders import grade_items
from evaluator.sandbox import SandboxLimits, run_python
from mathrl.graders import Grader
from tests.helpers.api import admin_key, overridden

pytestmark = pytest.mark.quick

GRADER: TypeAdapter[Any] = TypeAdapter(Grader)
REF = "{{item.reference_answer}}"
OUT = "{{sample.output_text}}"


def score(grader: dict[str, Any], sample: str, item: dict[str, Any]) -> Any:
    return grade_items(GRADER.validate_python(grader), [sample], [None], items=[item])[0]


def test_string_check_in_openais_form() -> None:
    g = {"type": "string_check", "name": "exact", "input": OUT, "reference": REF, "operation": "eq"}
    assert score(g, "42", {"reference_answer": "42"}).score == 1.0
    assert score({**g, "operation": "ne"}, "42", {"reference_answer": "42"}).score == 0.0
    assert score({**g, "operation": "like"}, "it is 42.", {"reference_answer": "42"}).score == 1.0
    assert score({**g, "operation": "like"}, "It Is FORTY", {"reference_answer": "forty"}).score == 0.0
    assert score({**g, "operation": "ilike"}, "It Is FORTY", {"reference_answer": "forty"}).score == 1.0
    # output_json and nested item fields
    j = {**g, "input": "{{sample.output_json.answer}}", "reference": "{{item.gold.value}}"}
    assert score(j, '{"answer": "7"}', {"gold": {"value": "7"}}).score == 1.0
    missing = score(g, "42", {"other": 1})
    assert missing.score == 0.0 and missing.error == "invalid_variable_error" and "reference_answer" in missing.reason


def test_text_similarity_metrics_are_the_libraries() -> None:
    import sacrebleu
    from nltk.translate.gleu_score import sentence_gleu
    from rapidfuzz import fuzz
    from rouge_score import rouge_scorer

    text, ref = "the cat sat on the mat", "the cat sat on a mat"
    item = {"reference_answer": ref}

    def sim(metric: str) -> float:
        g = {"type": "text_similarity", "name": "s", "input": OUT, "reference": REF, "evaluation_metric": metric}
        return float(score(g, text, item).score)

    assert sim("fuzzy_match") == pytest.approx(fuzz.ratio(text, ref) / 100)
    assert sim("bleu") == pytest.approx(sacrebleu.sentence_bleu(text, [ref]).score / 100)
    assert sim("gleu") == pytest.approx(sentence_gleu([ref.split()], text.split()))
    rouge = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])
    expected = rouge.score(ref, text)
    assert sim("rouge_1") == pytest.approx(expected["rouge1"].fmeasure)
    assert sim("rouge_2") == pytest.approx(expected["rouge2"].fmeasure)
    assert sim("rouge_l") == pytest.approx(expected["rougeL"].fmeasure)
    assert 0 < sim("meteor") < 1 and sim("rouge_5") == 0.0
    same = {"type": "text_similarity", "reference": REF, "evaluation_metric": "fuzzy_match", "pass_threshold": 0.9}
    assert score(same, text, item).score == 1.0  # 0.905 >= 0.9
    with pytest.raises(ValidationError, match="embedding model"):
        GRADER.validate_python({"type": "text_similarity", "reference": REF, "evaluation_metric": "cosine"})


def test_a_template_is_read_in_linear_time() -> None:
    """'{{' and spaces with no '}}' backtracked in cubic time (4,000 characters: 34 s, inside the
    request's validation, on the API's event loop)."""
    import time

    from mathrl import templates

    start = time.perf_counter()
    with pytest.raises(ValidationError, match="a variable is"):  # the one variable, empty
        GRADER.validate_python({"type": "string_check", "input": "{{" + " " * 3_980 + "x {{ }}", "reference": REF})
    assert templates.variables("{{" + " " * 20_000) == []
    assert time.perf_counter() - start < 1.0  # cubic: 34 s for the first, hours for the second
    assert templates.render("{{ item.a }}-{{item.b}}", {}, {"a": "1", "b": 2}) == "1-2"


def test_multi_grader_formula_is_evaluated_safely() -> None:
    g = {
        "type": "multi",
        "name": "both",
        "graders": {
            "exact": {"type": "string_check", "input": OUT, "reference": REF, "operation": "eq"},
            "close": {"type": "text_similarity", "reference": REF, "evaluation_metric": "fuzzy_match"},
        },
        "calculate_output": "0.5 * exact + 0.5 * close^2",
    }
    r = score(g, "41", {"reference_answer": "42"})
    assert r.sub == {"exact": 0.0, "close": 0.5} and r.score == pytest.approx(0.125)
    for formula, match in [
        ("__import__('os').system('true')", "may be called"),
        ("exact.__class__", "Attribute"),
        ("exact + nobody", "not one of the graders"),
        ("exact + max", "max is a function, call it"),  # before: a KeyError when computed
        ("[exact][0]", "not allowed"),
        ("2 ** 999", None),
        ("-" * 990 + "exact", "nests deeper than 200"),  # before: RecursionError when computed, deep in a call
    ]:
        bad = {**g, "calculate_output": formula}
        if match is None:  # parses; refused when computed: a 0 with formula_parse_error
            assert score(bad, "42", {"reference_answer": "42"}).error == "formula_parse_error"
            continue
        with pytest.raises(ValidationError, match=match):
            GRADER.validate_python(bad)


def test_python_grader_scores_and_reports_its_errors() -> None:
    g = {
        "type": "python",
        "name": "py",
        "source": "def grade(sample, item):\n    return float(sample['output_text'].strip() == item['reference_answer'])",  # noqa: E501
    }
    assert score(g, " 42 ", {"reference_answer": "42"}).score == 1.0
    raised = score({**g, "source": "def grade(sample, item):\n    return 1 / 0"}, "x", {})
    assert raised.error == "python_grader_runtime_error" and "ZeroDivisionError" in (raised.detail or "")
    for value in ("float('nan')", "float('-inf')"):  # a NaN reward reached the advantages; graders/run's mean was null
        odd = score({**g, "source": f"def grade(sample, item):\n    return {value}"}, "x", {})
        assert odd.score == 0.0 and odd.error == "python_grader_runtime_error", odd
        assert "not a finite number" in (odd.detail or ""), odd
    with pytest.raises(ValidationError, match="does not compile"):
        GRADER.validate_python({**g, "source": "def grade(:"})


SANDBOX = SandboxLimits(cpu_seconds=2, memory_mb=256, file_mb=1, wall_seconds=10)


@pytest.mark.parametrize(
    ("what", "source", "kind", "says"),
    [
        ("a socket", "import socket\nsocket.create_connection(('127.0.0.1', 5432))", "runtime", "not allowed"),
        ("a file outside", "open('/etc/hostname').read()", "runtime", "may not read"),
        ("a write outside", "open('/var/tmp/pwned', 'w').write('x')", "runtime", "only in its own directory"),
        ("a fork", "import os\nos.fork()", "runtime", "os.fork is not allowed"),
        ("a subprocess", "import subprocess\nsubprocess.run(['true'])", "runtime", "not allowed"),
        ("threads", "import threading\nthreading.Thread(target=print).start()", "runtime", "threads are not allowed"),
        ("memory", "x = bytearray(512 * 1024 * 1024)", "runtime", "MemoryError"),
        ("a big file", "open('f', 'wb').write(b'x' * 4 * 1024 * 1024)", "runtime", "File too large"),
        ("CPU", "while True:\n        pass", "server", "cpu_limit"),
        ("raw memory", "import ctypes\nctypes.string_at(1, 8)", "runtime", "not allowed"),
    ],
)
def test_the_sandbox_holds(what: str, source: str, kind: str, says: str) -> None:
    body = "\n".join("    " + line for line in source.splitlines())
    src = f"def grade(sample, item):\n{body}\n    return 1.0\n"
    t = time.monotonic()
    (r,) = run_python(src, [({"output_text": ""}, {})], SANDBOX)
    assert r.score is None and r.error == kind and says in (r.detail or ""), (what, r)
    assert time.monotonic() - t < SANDBOX.wall_seconds
    # what it may do: its own directory, the standard library and installed packages
    ok = "def grade(sample, item):\n    import json, numpy\n    open('mine', 'w').write('1')\n    return float(open('mine').read())"  # noqa: E501
    assert run_python(ok, [({}, {})], SANDBOX)[0].score == 1.0


# --- through the openai package -------------------------------------------------------------


@pytest.fixture(scope="module")
def openai_client(app_client: Any) -> Any:
    from openai import OpenAI

    key = admin_key(app_client)["Authorization"].removeprefix("Bearer ")
    return OpenAI(base_url=f"{app_client.base_url}/v1", api_key=key, http_client=app_client, max_retries=0)


GRADERS = {
    "string_check": {"type": "string_check", "name": "exact", "input": OUT, "reference": REF, "operation": "eq"},
    "text_similarity": {
        "type": "text_similarity",
        "name": "close",
        "input": OUT,
        "reference": REF,
        "evaluation_metric": "fuzzy_match",
    },
    "python": {
        "type": "python",
        "name": "py",
        "source": "def grade(sample, item):\n    return 1.0 if item['reference_answer'] in sample['output_text'] else 0.0",  # noqa: E501
    },
}


def test_graders_run_and_validate_with_the_openai_sdk(openai_client: Any) -> None:
    import openai

    item = {"reference_answer": "42"}
    expected = {"string_check": 0.0, "text_similarity": 0.5, "python": 1.0}  # sample '4 2' vs '42'... see below
    for name, grader in GRADERS.items():
        out = openai_client.fine_tuning.alpha.graders.run(grader=grader, model_sample="42", item=item)
        assert out.reward == 1.0, (name, out)
        assert out.metadata.type == name and out.metadata.name == grader["name"]
        assert not any(v for k, v in out.metadata.errors.model_dump().items() if isinstance(v, bool)), out
        valid = openai_client.fine_tuning.alpha.graders.validate(grader=grader)
        assert valid.grader is not None and valid.grader.type == name
    wrong = openai_client.fine_tuning.alpha.graders.run(grader=GRADERS["python"], model_sample="41", item=item)
    assert wrong.reward == 0.0 and expected["python"] == 1.0
    multi = {
        "type": "multi",
        "name": "mix",
        "graders": {"exact": GRADERS["string_check"], "py": GRADERS["python"]},
        "calculate_output": "0.25 * exact + 0.75 * py",
    }
    out = openai_client.fine_tuning.alpha.graders.run(grader=multi, model_sample="it is 42", item=item)
    assert out.reward == pytest.approx(0.75) and out.sub_rewards == {"exact": 0.0, "py": 1.0}
    assert openai_client.fine_tuning.alpha.graders.validate(grader=multi).grader.type == "multi"
    # errors as OpenAI reports them: a 200 with the kind set
    raised = {**GRADERS["python"], "source": "def grade(sample, item):\n    raise ValueError('no')"}
    out = openai_client.fine_tuning.alpha.graders.run(grader=raised, model_sample="x", item=item)
    assert out.reward == 0.0 and out.metadata.errors.python_grader_runtime_error
    assert "ValueError: no" in out.metadata.errors.python_grader_runtime_error_details
    out = openai_client.fine_tuning.alpha.graders.run(grader=GRADERS["string_check"], model_sample="x", item={})
    assert out.metadata.errors.invalid_variable_error
    # refusals: 422s that name the field
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        openai_client.fine_tuning.alpha.graders.validate(
            grader={
                "type": "text_similarity",
                "name": "c",
                "input": OUT,
                "reference": REF,
                "evaluation_metric": "cosine",
            }
        )
    with pytest.raises(openai.BadRequestError, match="not one of the graders"):
        openai_client.fine_tuning.alpha.graders.validate(grader={**multi, "calculate_output": "exact + nope"})
    score_model = {
        "type": "score_model",
        "name": "judge",
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "input": [{"role": "user", "content": OUT}],
    }
    assert openai_client.fine_tuning.alpha.graders.validate(grader=score_model).grader.type == "score_model"
    # a grading model must be one mathrl can load: an 'ft:' name of another project's (or no) job is a 422
    stranger = {**score_model, "model": f"ft:m:s:ftjob-{'0' * 32}"}
    with pytest.raises(openai.BadRequestError, match="no job"):
        openai_client.fine_tuning.alpha.graders.run(grader=stranger, model_sample="x", item=item)
    with pytest.raises(openai.BadRequestError, match="not a fine-tuned model's name"):
        openai_client.fine_tuning.alpha.graders.validate(grader={**score_model, "model": "ft:gpt-4o:x"})
    # an OpenAI judge's name: taken for a hub id before, the job failed on the worker; mapped as a job's model is
    judge = {**score_model, "model": "gpt-4o-2024-08-06"}
    multi = {"type": "multi", "graders": {"j": judge}, "calculate_output": "j"}
    for grader, param in ((judge, "grader.model"), (multi, "grader.graders.j.model")):
        with pytest.raises(openai.BadRequestError, match="cannot grade with") as e:
            openai_client.fine_tuning.alpha.graders.validate(grader=grader)
        assert e.value.param == param, e.value.body
    with overridden(fine_tuning={"model_aliases": {"gpt-4o-2024-08-06": "HuggingFaceTB/SmolLM2-135M-Instruct"}}):
        mapped = openai_client.fine_tuning.alpha.graders.validate(grader=multi).grader
    assert mapped.graders["j"]["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct", mapped
    # an item over a grade job's limits, for a grader that grades on a worker: a 400 at /item, not a 500
    with pytest.raises(openai.BadRequestError, match="/item/answer"):
        openai_client.fine_tuning.alpha.graders.run(grader=score_model, model_sample="x", item={"answer": "1" * 10_001})


def test_one_projects_slow_python_graders_do_not_fail_anothers_calls(app_client: Any) -> None:
    """A project busy with python graders that burn their CPU limit; another project's calls meanwhile."""
    slow = {"Authorization": admin_key(app_client)["Authorization"]}
    other = admin_key(app_client)
    hog = {"type": "python", "name": "hog", "source": "def grade(sample, item):\n    while True:\n        pass"}

    def burn() -> Any:
        return app_client.post(
            "/v1/fine_tuning/alpha/graders/run", json={"grader": hog, "model_sample": "x"}, headers=slow
        )

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        hogs = [pool.submit(burn) for _ in range(2)]
        time.sleep(0.5)
        latencies = []
        while not all(h.done() for h in hogs):
            t = time.perf_counter()
            r = app_client.post(
                "/v1/fine_tuning/alpha/graders/run",
                json={"grader": GRADERS["string_check"], "model_sample": "42", "item": {"reference_answer": "42"}},
                headers=other,
            )
            latencies.append(time.perf_counter() - t)
            assert r.status_code == 200 and r.json()["reward"] == 1.0, r.text
        for h in hogs:
            body = h.result().json()
            assert body["reward"] == 0.0 and body["metadata"]["errors"]["python_grader_server_error"], body
    print(f"\nother project's calls while the hogs ran: {len(latencies)}, slowest {max(latencies):.2f} s")
    assert latencies and max(latencies) < 3.0


def test_a_messages_file_reaches_the_grader_as_its_item(tmp_path: Any, tiny_model: str) -> None:
    """OpenAI's JSONL in a GRPO job: the chat is the prompt, the other fields the grader's `item`,
    as TRL passes a dataset's columns to a reward. A `developer` message (OpenAI's RFT examples)
    is the system message, as a chat call reads it: it reached the chat template as written."""
    import json

    from evaluator.models import load_tokenizer
    from mathrl.specs import DatasetRef
    from trainer.data import load_problems, prompt_dataset
    from trainer.rewards import get_reward

    path = tmp_path / "rft.jsonl"
    rows = [
        {
            "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "12 + 30?"}],
            "ref": 42,
        },
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "7 + 8?"}]}], "ref": "15", "x": [1]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = load_tokenizer(tiny_model)
    problems, _ = load_problems(DatasetRef(path=str(path), format="messages"), None)
    dataset, dropped = prompt_dataset(problems, "math-chat", tok)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "12 + 30?"}]
    assert dropped == 0 and dataset[0]["prompt"] == tok.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    )
    assert "7 + 8?" in dataset[1]["prompt"] and json.loads(dataset[1]["item"]) == {"ref": "15", "x": [1]}
    reward = get_reward("grader", grader={"type": "string_check", "input": OUT, "reference": "{{item.ref}}"})
    columns = {k: list(dataset[k]) for k in dataset.column_names if k != "prompt"}  # as TRL passes them
    assert reward(["42", "16"], prompts=list(dataset["prompt"]), **columns) == [1.0, 0.0]
    assert reward(["41", "15"], prompts=list(dataset["prompt"]), **columns) == [0.0, 1.0]


def test_model_graders_read_the_grading_models_answer(tiny_model: str) -> None:
    """score_model and label_model: the answer's parsing, and the whole path on a real (tiny,
    untrained) model: templates filled, the chat generated, the answer read."""
    from evaluator.chat import judges
    from evaluator.graders import read_label, read_score
    from mathrl.graders import LabelModelGrader, ScoreModelGrader

    msgs = [{"role": "developer", "content": "Grade it."}, {"role": "user", "content": f"{OUT} vs {REF}"}]
    sm = ScoreModelGrader(name="s", model=tiny_model, input=msgs, range=[0, 10])
    assert read_score(sm, "7").score == 7.0
    assert read_score(sm, '{"score": 3.5, "why": "close"}').score == 3.5
    assert read_score(sm, "I'd say 42/10").score == 10.0  # kept within the range
    none = read_score(sm, "no idea")
    assert none.score == 0.0 and none.error == "model_grader_parse_error" and "no score" in (none.detail or "")
    lm = LabelModelGrader(name="l", model=tiny_model, input=msgs, labels=["good", "bad"], passing_labels=["good"])
    assert read_label(lm, "Good.").score == 1.0
    assert read_label(lm, "this one is bad, not good").score == 0.0  # the first label named
    assert read_label(lm, "maybe").error == "model_grader_parse_error"
    # the whole path, the grading model loaded once for both graders
    cache: dict[str, Any] = {}
    item = {"reference_answer": "42"}
    for g in (sm, lm):
        (r,) = grade_items(g, ["42"], [None], items=[item], judge=judges(cache=cache))
        assert r.reason.startswith(("the grading model", "no score in", "the grading model gave none")), r
        assert (0.0 <= r.score <= 10.0) and (r.error in (None, "model_grader_parse_error"))
    assert list(cache) == [tiny_model]
    chat = cache[tiny_model].prompt([{"role": "user", "content": "42 vs 42"}])
    assert "42 vs 42" in chat  # the template's variables were filled before the chat template
    bad = ScoreModelGrader(name="s", model=tiny_model, input=[{"role": "user", "content": "{{item.nope}}"}])
    (r,) = grade_items(bad, ["x"], [None], items=[item], judge=judges(cache=cache))
    assert r.error == "invalid_variable_error"


def test_ft_model_names_are_job_references() -> None:
    from mathrl.modelref import check_model_ref, ft_model_name, ft_model_ref

    job = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
    name = ft_model_name("HuggingFaceTB/SmolLM2-135M-Instruct", "adder", job)
    assert name == "ft:SmolLM2-135M-Instruct:adder:ftjob-0190a1b2c3d47e5f8a9b0c1d2e3f4a5b"
    assert ft_model_ref(name) == f"job:{job}@final"
    assert check_model_ref(ft_model_name("m", "s", job, step=4)) == f"job:{job}@step-4"
    assert ft_model_ref("ft:gpt-4o:org") is None and ft_model_ref("gpt-4o") is None
    # a base that is another job's model or a tiny model: its ':' and '@' made a name no route read back
    for base in (f"job:{job}@final", "tiny:2x64"):
        assert ft_model_ref(ft_model_name(base, "more", job)) == f"job:{job}@final", ft_model_name(base, "more", job)


def test_completion_requests_are_checked_before_any_job(openai_client: Any) -> None:
    """The sampling routes' own refusals, through the `openai` package: no job is made for them.
    A stop string of any length up to 200 is one stop (a bound on the list once refused it)."""
    import openai

    name = f"ft:m:s:ftjob-{'0' * 32}"
    chat = [{"role": "user", "content": "1 + 1?"}]
    with pytest.raises(openai.NotFoundError, match="does not exist or you do not have access"):
        openai_client.chat.completions.create(model=name, messages=chat, stop="Answer:")
    with pytest.raises(openai.BadRequestError, match="stop"):
        openai_client.chat.completions.create(model=name, messages=chat, stop=["1", "2", "3", "4", "5"])
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):  # (logprobs themselves are served)
        openai_client.chat.completions.create(model=name, messages=chat, top_logprobs=21, logprobs=True)
    # what LangChain, litellm and lm-eval send at neutral values passes (to the model's 404 here); a value
    # that would mean something is a 400 naming its field
    neutral = {
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "logit_bias": {},
        "top_logprobs": None,
        "logprobs": False,
        "response_format": {"type": "text"},
        "service_tier": "auto",
        "parallel_tool_calls": False,
        "prompt_cache_key": "k",
        "safety_identifier": "u",
        "reasoning_effort": "none",
        "stream_options": None,
    }
    for field, value in neutral.items():
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            openai_client.chat.completions.create(model=name, messages=chat, **{field: value})
    for field, value in (
        ("frequency_penalty", 0.5),
        ("logit_bias", {"42": 5}),
        # a schema feature not served (json_object and json_schema are: tests/unit/api/test_structured_outputs.py)
        ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            openai_client.chat.completions.create(model=name, messages=chat, **{field: value})
        assert (e.value.param or "").startswith(field), (field, e.value.body)
    with pytest.raises(openai.NotFoundError):
        openai_client.completions.create(model="gpt-4o", prompt="1 + 1 =")
    assert openai_client.models.list().data == []
