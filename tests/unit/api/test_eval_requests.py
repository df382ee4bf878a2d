"""An eval run's request mapped to its job (api/openai/eval_requests.py), without FastAPI or a
database: the criteria as one `multi` grader, OpenAI's sampling parameters as the eval job's,
a Responses-style run as a completions one, and each bad field a 400 at the request's own pointer,
also where the job's spec is what refuses it."""

from __future__ import annotations

from typing import Any

import pytest

from api.openai.eval_requests import as_sampled, criteria, job_spec, run_job, sampling_of, template_text
from api.problems import Problem
from mathrl.specs import EvalSpec, GradeSpec
from mathrl.specs.generate import DEFAULT_MAX_TOKENS, effort_budget

pytestmark = pytest.mark.quick


def refused(call: Any, *args: Any) -> tuple[int, str]:
    with pytest.raises(Problem) as e:
        call(*args)
    assert e.value.errors, e.value.detail
    return e.value.status, e.value.errors[0]["pointer"]


STRING_CHECK = {"type": "string_check", "name": "exact", "input": "{{sample.output_text}}", "operation": "eq"}
STRING_CHECK["reference"] = "{{item.a}}"
SIMILAR = {"type": "text_similarity", "name": "close", "input": "{{sample.output_text}}", "reference": "{{item.a}}"}


def test_the_criteria_are_one_multi_grader_with_each_ones_pass_rule() -> None:
    multi, rules = criteria([STRING_CHECK, {**SIMILAR, "evaluation_metric": "bleu", "pass_threshold": 0.5}])
    assert multi.type == "multi" and sorted(multi.graders) == ["c0", "c1"]
    assert rules == [
        {"name": "exact", "type": "string_check", "pass_threshold": None},
        {"name": "close", "type": "text_similarity", "pass_threshold": 0.5},
    ]
    assert refused(criteria, [{**STRING_CHECK, "type": "regex"}]) == (400, "/testing_criteria/0/type")
    assert refused(criteria, [STRING_CHECK, {**SIMILAR, "evaluation_metric": "bleu"}]) == (
        400,
        "/testing_criteria/1/pass_threshold",
    )
    assert refused(criteria, [{**STRING_CHECK, "pass_threshold": 1}]) == (400, "/testing_criteria/0/pass_threshold")
    bad_operation = refused(criteria, [{**STRING_CHECK, "operation": "sounds_like"}])
    assert bad_operation[1].startswith("/testing_criteria/0/operation"), bad_operation


def test_openais_sampling_parameters_are_the_eval_jobs() -> None:
    at = "/data_source/sampling_params"
    assert sampling_of({}, at) == {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": DEFAULT_MAX_TOKENS, "seed": 0}
    low = sampling_of({"reasoning_effort": "low", "temperature": 0.0, "seed": 3}, at)
    assert low == {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": effort_budget("low"), "seed": 3}
    assert sampling_of({"max_completions_tokens": 64}, at)["max_new_tokens"] == 64  # the graders' spelling
    assert refused(sampling_of, {"logit_bias": {}}, at) == (400, f"{at}/logit_bias")
    assert refused(sampling_of, {"reasoning_effort": "max"}, at) == (400, f"{at}/reasoning_effort")


def test_a_responses_run_is_a_completions_run_and_its_unserved_fields_are_named() -> None:
    ds = {
        "type": "responses",
        "model": "m",
        "sampling_params": {"temperature": 0.2, "text": {"format": {"type": "text"}}},
    }
    assert as_sampled(ds)["sampling_params"] == {"temperature": 0.2}
    tools = {**ds, "sampling_params": {"tools": [{"type": "function"}]}}
    assert refused(as_sampled, tools) == (400, "/data_source/sampling_params/tools")
    schema = {**ds, "sampling_params": {"text": {"format": {"type": "json_schema"}}}}
    assert refused(as_sampled, schema) == (400, "/data_source/sampling_params/text/format")
    stored = {**ds, "source": {"type": "responses"}}
    assert refused(as_sampled, stored) == (400, "/data_source/source/type")
    parts = [{"role": "user", "content": [{"type": "input_text", "text": "2+2="}, {"type": "input_text", "text": "?"}]}]
    assert template_text(parts) == [{"role": "user", "content": "2+2=?"}]
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]
    assert refused(template_text, image) == (400, "/data_source/input_messages/template/0/content")
    assert refused(run_job, None, None, "p", {"type": "logs"}, None) == (400, "/data_source/type")


def test_the_jobs_spec_is_parsed_and_its_errors_point_into_the_run() -> None:
    grade = {
        "kind": "grade",
        "grader": STRING_CHECK,
        "items": [{"completion": "4", "answer": "4", "fields": {"a": "4"}}],
    }
    assert isinstance(job_spec(grade), GradeSpec)
    run: dict[str, Any] = {
        "kind": "eval",
        "model": "tiny",
        "dataset": {"format": "items", "file": "file-" + "0" * 32, "template": [{"role": "user", "content": "hi"}]},
        "recipe": "plain",
        "grader": grade["grader"],
    }
    assert isinstance(job_spec(run), EvalSpec)
    assert refused(job_spec, {**run, "dataset": {**run["dataset"], "template": [{"role": "robot", "content": "x"}]}})[
        1
    ].startswith("/data_source/input_messages/template/0")
    assert refused(job_spec, {**run, "sampling": {"temperature": -1}})[1] == "/data_source/sampling/temperature"
