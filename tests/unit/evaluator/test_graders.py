"""Graders (mathrl/graders.py, evaluator/graders.py): each type's score and reason, a weighted
combination, the same object as a GRPO reward, and POST /v1/graders:run with its refusals.
(The reward-model grader in a GRPO job and an eval job: tests/system/test_trainer.py.)"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from evaluator.graders import grade_items
from mathrl.graders import Grader
from mathrl.specs import GRPOSpec
from tests.helpers.api import admin_key

pytestmark = pytest.mark.quick

GRADER: TypeAdapter[Any] = TypeAdapter(Grader)


def run(grader: dict[str, Any], completions: list[str], answers: list[str | None], **kw: Any) -> list[Any]:
    return grade_items(GRADER.validate_python(grader), completions, answers, **kw)


def test_math_grader_scores_and_says_why() -> None:
    r = run({"type": "math"}, ["so 1/2 of it: \\boxed{\\frac{1}{2}}", "#### 7", "I give up"], ["0.5", "8", "3"])
    assert [x.score for x in r] == [1.0, 0.0, 0.0]
    assert "equals the gold '0.5'" in r[0].reason and "(boxed)" in r[0].reason
    assert "'7' (####) differs from the gold '8'" in r[1].reason
    assert r[2].reason == "no final answer found"
    strict = run({"type": "math", "answer_pattern": "#### (\\d+)"}, ["the answer is 8", "#### 8"], ["8", "8"])
    assert [x.score for x in strict] == [0.0, 1.0] and "no match" in strict[0].reason
    cut = run({"type": "math"}, ["16 x 3 = 48 and then 4"], ["4"], truncated=[True])
    assert cut[0].score == 0.0 and "cut off" in cut[0].reason


def test_string_regex_and_length_graders() -> None:
    eq = run({"type": "string_check"}, ["#### 12", "#### 13"], ["12", "12"])
    assert [x.score for x in eq] == [1.0, 0.0] and "'12' eq '12': yes" in eq[0].reason
    contains = {"type": "string_check", "input": "completion", "operation": "icontains", "reference": "STEP"}
    has = run(contains, ["Step 1"], [None])
    assert has[0].score == 1.0
    fmt = run({"type": "regex", "pattern": "\\\\boxed\\{"}, ["\\boxed{3}", "3"], [None, None])
    assert [x.score for x in fmt] == [1.0, 0.0]
    assert run({"type": "regex", "pattern": "sorry", "negate": True}, ["sorry"], [None])[0].score == 0.0
    length = {"type": "length_penalty", "max_length": 8, "buffer": 4}
    assert [x.score for x in run(length, ["a b c d", "a b c d e f", "a " * 20], [None] * 3)] == [0.0, -0.5, -1.0]
    tokens = run(length, ["x", "x"], [None, None], completion_ids=[[1] * 4, [1] * 7])  # GRPO: token counts
    assert [x.score for x in tokens] == [0.0, -0.75] and "tokens" in tokens[1].reason


def test_weighted_grader_sums_its_parts() -> None:
    grader = {
        "type": "weighted",
        "graders": [
            {"grader": {"type": "math"}, "weight": 1.0},
            {"grader": {"type": "regex", "pattern": "####"}, "weight": 0.1},
        ],
    }
    r = run(grader, ["#### 5", "it is 5", "#### 4"], ["5", "5", "5"])
    assert [x.score for x in r] == pytest.approx([1.1, 1.0, 0.1])
    assert r[0].reason.startswith("1 x math 1 (") and "0.1 x regex 1 (pattern found)" in r[0].reason
    with pytest.raises(ValueError, match="needs its model loaded"):
        run({"type": "reward_model", "model": "/models/rm"}, ["x"], ["1"])


def test_the_hash_format_grader_everywhere_a_grader_goes(app_client: Any) -> None:
    """hash_format (a grader added as its spec class and one scorer): GSM8K's '#### <number>' line,
    as an item grader, a GRPO reward and through POST /v1/graders:run."""
    from trainer.rewards import get_reward

    texts = ["so 12 in all\n#### 1,234", "#### $-3.5", "the answer is 12", "#### twelve", "x\n####  7  \nthanks"]
    assert [r.score for r in run({"type": "hash_format"}, texts, [None] * 5)] == [1.0, 1.0, 0.0, 0.0, 1.0]
    spec = GRPOSpec.model_validate(
        {
            "model": "org/m",
            "dataset": {"name": "gsm8k-train"},
            "rewards": [{"name": "grader", "grader": {"type": "hash_format"}}],
        }
    )
    reward = get_reward("grader", grader=spec.rewards[0].grader, max_length=64)
    assert reward(texts[:3], answer=["1234", "-3.5", "12"], completion_ids=[[1]] * 3) == [1.0, 1.0, 0.0]
    body = {
        "grader": {"type": "hash_format"},
        "items": [{"completion": t} for t in texts[2:4]] + [{"completion": texts[0]}],
    }
    r = app_client.post("/v1/graders:run", json=body, headers=admin_key(app_client))
    assert r.status_code == 200, r.text
    assert [d["score"] for d in r.json()["data"]] == [0.0, 0.0, 1.0]
    assert r.json()["data"][0]["reason"] == "no '#### <number>' answer line"


def test_a_grader_is_a_grpo_reward() -> None:
    from trainer.rewards import get_reward

    base = {"model": "org/m", "dataset": {"name": "gsm8k-train"}}
    spec = GRPOSpec.model_validate({**base, "rewards": [{"name": "grader", "grader": {"type": "math"}}]})
    reward = get_reward("grader", grader=spec.rewards[0].grader, max_length=4)
    assert reward.__name__ == "grader_math"
    ids = [[1], [1, 2], [1, 2, 3, 4]]
    scores = reward(["#### 5", "so 2 + 3 = 5", "2 + 3 ="], answer=["5", "5", "5"], completion_ids=ids)
    assert scores == [1.0, 1.0, 0.0]  # the last was cut off at 4 tokens: its '3' is no answer
    with pytest.raises(ValidationError, match="needs 'grader'"):
        GRPOSpec.model_validate({**base, "rewards": [{"name": "grader"}]})


def test_graders_run_route(app_client: Any) -> None:
    headers = admin_key(app_client)
    body = {
        "grader": {
            "type": "weighted",
            "graders": [{"grader": {"type": "math"}}, {"grader": {"type": "regex", "pattern": "####"}, "weight": 0.5}],
        },
        "items": [{"completion": "#### 1,234", "answer": "1234"}, {"completion": "maybe 12", "answer": "1234"}],
    }
    r = app_client.post("/v1/graders:run", json=body, headers=headers)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [d["score"] for d in out["data"]] == [1.5, 0.0] and out["mean"] == 0.75
    assert "equals the gold '1234'" in out["data"][0]["reason"]
    assert app_client.get("/v1/jobs", headers=headers).json()["data"] == []  # no job was started


@pytest.mark.parametrize(
    ("grader", "pointer", "says"),
    [
        ({"type": "regex", "pattern": "(unclosed"}, "/grader/pattern", "not a regular expression"),
        (
            {"type": "weighted", "graders": [{"grader": {"type": "math"}, "weight": "heavy"}]},
            "/grader/graders/0/weight",
            "valid number",
        ),
        ({"type": "vibes"}, "/grader/type", "math"),
        ({"type": "reward_model", "model": "/models/rm"}, "/grader/model", "outside the model roots"),
        ({"type": "math", "answer_pattern": "####"}, "/grader/answer_pattern", "needs a group"),
    ],
)
def test_graders_run_refuses_bad_graders_with_the_field_named(
    app_client: Any, grader: dict[str, Any], pointer: str, says: str
) -> None:
    body = {"grader": grader, "items": [{"completion": "#### 1", "answer": "1"}]}
    r = app_client.post("/v1/graders:run", json=body, headers=admin_key(app_client))
    assert r.status_code == 422, r.text
    errors = r.json()["errors"]
    assert errors[0]["pointer"] == pointer and says in errors[0]["detail"], errors


def test_a_reward_model_grader_runs_as_a_grade_job_and_is_polled(app_client: Any) -> None:
    """The API has no torch: a grader with a reward model becomes a 'grade' job for a worker.
    With no worker here, the call answers 202 after `wait` with the job to poll."""
    headers = admin_key(app_client)
    rm_dir = (
        Path(os.environ["MATHRL_ARTIFACT_DIR"]).parent / "models" / "rm"
    )  # under the model roots; never loaded here
    body = {
        "grader": {"type": "reward_model", "model": str(rm_dir)},
        "items": [{"completion": "#### 1", "answer": "1", "prompt": "1?"}],
        "resources": {"pool": "graders-parked"},  # a pool no worker serves here
    }
    r = app_client.post("/v1/graders:run?wait=0", json=body, headers=headers)
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    assert r.headers["location"] == f"/v1/graders/runs/{job_id}" and r.json()["status"] == "queued"
    job = app_client.get(f"/v1/jobs/{job_id}", headers=headers).json()
    stored = [{k: v for k, v in item.items() if v is not None} for item in job["spec"]["items"]]
    assert job["kind"] == "grade" and stored == body["items"]
    again = app_client.get(f"/v1/graders/runs/{job_id}", headers=headers)
    assert again.status_code == 202 and again.json()["job_id"] == job_id
    # results of a job that is not a grading run, or of another project: 404
    assert app_client.get(f"/v1/graders/runs/{uuid.uuid4()}", headers=headers).status_code == 404
    assert app_client.get(f"/v1/graders/runs/{job_id}", headers=admin_key(app_client)).status_code == 404
    app_client.post(f"/v1/jobs/{job_id}/cancel", headers=headers)
    cancelled = app_client.get(f"/v1/graders/runs/{job_id}", headers=headers)
    assert cancelled.status_code == 409, cancelled.text
    # a grader that runs here takes no resources
    here = {"grader": {"type": "math"}, "items": body["items"], "resources": {"gpus": 1}}
    r = app_client.post("/v1/graders:run", json=here, headers=headers)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/resources", r.text


@pytest.mark.parametrize("resources", [{"processes": 2}, {"nodes": 2}])
def test_a_reward_model_grader_on_several_processes_or_nodes_is_a_422(
    app_client: Any, resources: dict[str, Any]
) -> None:
    """A grade job runs as one process on one node; asking for more was a 500 (found by the
    OpenAPI fuzzer: the grade job's own check raised inside the route)."""
    rm_dir = Path(os.environ["MATHRL_ARTIFACT_DIR"]) / "rm"
    body = {
        "grader": {"type": "reward_model", "model": str(rm_dir)},
        "items": [{"completion": "#### 1", "answer": "1"}],
        "resources": {"pool": "graders-parked", **resources},
    }
    r = app_client.post("/v1/graders:run?wait=0", json=body, headers=admin_key(app_client))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    error = r.json()["errors"][0]
    assert error["pointer"] == "/resources" and "one process on one node" in error["detail"], error


def test_text_similarity_is_scored_here_where_the_api_has_its_libraries_else_on_a_worker(
    app_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API image has not text_similarity's libraries (its size budget): there the call becomes
    a 'grade' job, as a grader with a model does; an API that has them scores it at once."""
    from evaluator import similarity

    headers = admin_key(app_client)
    body = {
        "grader": {"type": "text_similarity", "reference": "the answer is 42", "evaluation_metric": "fuzzy_match"},
        "items": [{"completion": "the answer is 42"}],
        "resources": {"pool": "graders-parked"},  # a pool no worker serves here
    }
    assert similarity.available()  # this venv has them: scored in the call
    here = app_client.post("/v1/graders:run", json={k: body[k] for k in ("grader", "items")}, headers=headers)
    assert here.status_code == 200 and here.json()["data"][0]["score"] == 1.0, here.text
    monkeypatch.setattr(similarity, "LIBRARIES", (*similarity.LIBRARIES, "no_such_library_here"))
    assert not similarity.available()
    r = app_client.post("/v1/graders:run?wait=0", json=body, headers=headers)
    assert r.status_code == 202, r.text
    job = app_client.get(f"/v1/jobs/{r.json()['job_id']}", headers=headers).json()
    assert job["kind"] == "grade" and job["spec"]["grader"]["type"] == "text_similarity", job
    app_client.post(f"/v1/jobs/{job['id']}/cancel", headers=headers)
