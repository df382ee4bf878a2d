"""The benchmark registry and loader (MATH from the hub's layout, answers from the solution's
last \\boxed{}), accuracy by subject and level, and a real tiny math500 eval job storing them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from evaluator.benchmarks import REGISTRY, Benchmark, get_benchmark
from evaluator.data import benchmark_load_args, load_benchmark
from evaluator.metrics import accuracy_breakdown
from mathrl.specs import EvalSpec
from tests.helpers.env import data_dir, shared_rows

HUB_FIELDS = ("problem", "level", "solution", "type")  # DigitalLearningGmbH/MATH-lighteval, config 'default'


def hub_layout(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Real MATH rows as the hub dataset has them: 'type' for the subject, 'Level N', no answer."""
    return [
        {
            "problem": r["problem"],
            "level": r["level"] if isinstance(r["level"], str) else f"Level {r['level']}",
            "solution": r["solution"],
            "type": r["subject"],
        }
        for r in rows
    ]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.quick
@pytest.mark.parametrize(("name", "split"), [("math", "test"), ("math-train", "train")])
def test_math_entries_load_one_hub_config_when_no_offline_copy(
    name: str, split: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What load_benchmark hands to datasets.load_dataset when the data dir lacks the copy: the
    # hub id with ONE config holding every subject, and the split (not EleutherAI/hendrycks_math,
    # whose per-subject configs make load_dataset(id) fail and whose rows have no answer field).
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    bench = get_benchmark(name)
    args, kwargs = benchmark_load_args(bench, str(tmp_path))
    assert args == ("DigitalLearningGmbH/MATH-lighteval", "default") and kwargs == {"split": split}
    # the hub rows have no 'answer': the gold must come from the solution
    assert bench.answer_field == "solution" and bench.answer_from == "boxed_solution"
    assert bench.question_field in HUB_FIELDS and ("type", "subject") in bench.renames
    # with the hub off and no copy, the error names the missing file instead of a network failure
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=str(bench.local_file)):
        benchmark_load_args(bench, str(tmp_path))


@pytest.mark.quick
def test_math_hub_layout_loads_through_the_local_copy_path(tmp_path: Path) -> None:
    rows = shared_rows("math_train.jsonl", 40)
    write_jsonl(tmp_path / "math_test.jsonl", hub_layout(rows))
    bench = get_benchmark("math")
    args, kwargs = benchmark_load_args(bench, str(tmp_path))
    assert args == ("json",) and kwargs == {"data_files": str(tmp_path / "math_test.jsonl"), "split": "train"}
    problems = load_benchmark(bench, str(tmp_path))
    assert len(problems) == 40
    for p in problems:
        src = rows[p.index]
        assert p.gold == src["answer"].strip()  # last \boxed{} of the solution == the curated answer
        assert p.question == src["problem"] and p.solution == src["solution"]
        assert p.meta == {"subject": src["subject"], "level": int(src["level"].split()[-1])}
    assert load_benchmark(bench, str(tmp_path), limit=5) == problems[:5]


@pytest.mark.quick
def test_math_hub_layout_as_parquet_and_odd_rows(tmp_path: Path) -> None:
    import datasets

    rows = [
        {"problem": "Nested?", "level": "Level 2", "type": "Algebra", "solution": "So $x=\\boxed{\\frac{1}{2}}$."},
        {
            "problem": "Two boxes?",
            "level": "Level ?",
            "type": "Geometry",
            "solution": "First \\boxed{3}, corrected: \\boxed{4}.",
        },
        {"problem": "Bare box?", "level": "Level 3", "type": "Algebra", "solution": "It is $\\boxed 9$."},
        {"problem": "No answer?", "level": "Level 5", "type": "Number Theory", "solution": "there are $\\boxed{}$"},
        {"problem": "No box?", "level": "Level 1", "type": "Prealgebra", "solution": "It is 7."},
    ]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "math_test.parquet"))
    bench = dataclasses.replace(get_benchmark("math"), local_file="math_test.parquet")
    assert benchmark_load_args(bench, str(tmp_path))[0] == ("parquet",)
    problems = load_benchmark(bench, str(tmp_path))
    assert [(p.index, p.gold, p.meta["level"], p.meta["subject"]) for p in problems] == [
        (0, "\\frac{1}{2}", 2, "Algebra"),
        (1, "4", "?", "Geometry"),
        (2, "9", 3, "Algebra"),
    ]


@pytest.mark.quick
def test_local_copies_keep_loading() -> None:
    d = data_dir()
    train = load_benchmark(get_benchmark("math-train"), d)
    rows = shared_rows("math_train.jsonl")
    # 7,500 rows: 2 have an empty \boxed{} (skipped); 2 written '\boxed 9' now get their answer
    assert len(rows) == 7500 and len(train) == 7498
    assert all(p.gold == rows[p.index]["answer"].strip() for p in train if rows[p.index]["answer"] is not None)
    assert {p.meta["level"] for p in train} == {1, 2, 3, 4, 5, "?"}
    assert len({p.meta["subject"] for p in train}) == 7
    m500 = load_benchmark(get_benchmark("math500"), d, limit=3)
    assert m500[0].meta["level"] == 2 and m500[0].meta["subject"] == "Precalculus"


@pytest.mark.quick
def test_registry_rejects_an_unknown_answer_source() -> None:
    with pytest.raises(ValueError, match="answer_from"):
        dataclasses.replace(REGISTRY["math"], answer_from="last_line")
    assert isinstance(get_benchmark("math"), Benchmark)


@pytest.mark.quick
def test_auto_dtype_is_the_same_for_both_backends() -> None:
    # vLLM's own "auto" would take bfloat16 from a config on a CPU: emulated there, ~5x slower,
    # and different greedy text from the HF backend's float32
    from evaluator.models import resolve_dtype

    assert resolve_dtype("auto", on_gpu=False) == "float32"
    assert resolve_dtype("auto", on_gpu=True) == "bfloat16"
    assert resolve_dtype("float16", on_gpu=False) == "float16"


@pytest.mark.quick
def test_accuracy_breakdown_by_subject_and_level() -> None:
    metas = [
        {"subject": "Algebra", "level": 2},
        {"subject": "Algebra", "level": 10},
        {"subject": "Geometry", "level": 2},
        {"subject": "Algebra", "level": "?"},
        {"subject": "Geometry"},
        {},
    ]
    correct = [True, False, True, True, False, True]
    got = accuracy_breakdown(metas, correct)
    assert got == {
        "accuracy/subject=Algebra": (2, 3),
        "accuracy/subject=Geometry": (1, 2),
        "accuracy/level=2": (2, 2),
        "accuracy/level=10": (0, 1),
        "accuracy/level=?": (1, 1),
    }
    assert list(got)[2:] == ["accuracy/level=2", "accuracy/level=10", "accuracy/level=?"]
    assert accuracy_breakdown([{}, {"unique_id": "x"}], [True, False]) == {}  # GSM8K: nothing to break down
    with pytest.raises(ValueError):
        accuracy_breakdown(metas, correct[:-1])


@pytest.mark.quick
def test_an_eval_on_a_named_dataset_evaluates_that_set_not_gsm8k() -> None:
    from evaluator.recipes import resolve_recipe
    from evaluator.run import _problems

    spec = EvalSpec(model="m", dataset={"name": "math500", "split": "test"}, limit=3)
    bench, problems = _problems(spec, data_dir())
    assert bench.name == "math500" and len(problems) == 3 and problems[0].meta["subject"]
    assert resolve_recipe(spec).name == "math-chat"
    # 'gsm8k' with split 'train' is the registered train split
    bench, _ = _problems(EvalSpec(model="m", dataset={"name": "gsm8k", "split": "train"}, limit=1), data_dir())
    assert bench.name == "gsm8k-train"


@pytest.mark.quick
def test_a_named_dataset_without_that_split_is_refused(app_client: Any) -> None:
    from tests.helpers.api import admin_key

    spec = {"kind": "eval", "model": "org/m", "resources": {"gpus": 1}, "dataset": {"name": "math500", "split": "dev"}}
    r = app_client.post("/v1/jobs", json=spec, headers=admin_key(app_client))
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/dataset/split", r.text
    assert "has no split 'dev'; it has test" in r.json()["detail"]


@pytest.mark.quick
def test_a_local_set_without_the_named_fields_is_refused_at_submit(
    app_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from tests.helpers.api import admin_key

    data = tmp_path_factory.mktemp("userdata") / "set.jsonl"
    data.write_text('{"problem": "1+1?", "solution": "2"}\n')
    headers = admin_key(app_client)
    spec = {"kind": "eval", "model": "org/m", "resources": {"gpus": 1}, "dataset": {"path": str(data)}}
    r = app_client.post("/v1/jobs", json=spec, headers=headers)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["pointer"] == "/dataset/question_field"
    assert "no field 'question' (its fields: problem, solution)" in r.json()["detail"]
    spec["dataset"] = {"path": str(data), "question_field": "problem", "answer_field": "solution"}
    assert app_client.post("/v1/jobs", json=spec, headers=headers).status_code == 201
    # a parquet file: its schema, read from the footer
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = data.with_suffix(".parquet")
    pq.write_table(pa.table({"problem": ["1+1?"], "solution": ["2"]}), table)
    spec["dataset"] = {"path": str(table), "question_field": "problem", "answer_field": "answer"}
    r = app_client.post("/v1/jobs", json=spec, headers=headers)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/dataset/answer_field", r.text
    assert "no field 'answer' (its fields: problem, solution)" in r.json()["detail"]
    spec["dataset"]["answer_field"] = "solution"
    assert app_client.post("/v1/jobs", json=spec, headers=headers).status_code == 201
    broken = data.with_name("broken.parquet")
    broken.write_bytes(b"not parquet at all")
    spec["dataset"]["path"] = str(broken)
    r = app_client.post("/v1/jobs", json=spec, headers=headers)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/dataset/path", r.text
    # OpenAI's chat lines name no question or answer field: they were refused for lacking 'question'
    chats = data.with_name("chats.jsonl")
    chats.write_text('{"messages": [{"role": "user", "content": "1+1?"}], "reference_answer": "2"}\n')
    spec["dataset"] = {"path": str(chats), "format": "messages", "answer_field": "reference_answer"}
    assert app_client.post("/v1/jobs", json=spec, headers=headers).status_code == 201
    chats.write_text('{"messages": [{"role": "robot", "content": "1+1?"}]}\n')
    r = app_client.post("/v1/jobs", json=spec, headers=headers)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/dataset/path", r.text
    assert "not a chat in OpenAI's format" in r.json()["detail"], r.text
    rows = data.with_name("rows.json")  # a JSON array (datasets reads it): 'its first row is not JSON' before
    rows.write_text('[{"question": "1+1?", "answer": "2"}]')
    spec["dataset"] = {"path": str(rows)}
    assert app_client.post("/v1/jobs", json=spec, headers=headers).status_code == 201


@pytest.mark.quick
@pytest.mark.parametrize(
    ("dataset", "pointer"),
    [
        ({"hub": "/etc/passwd"}, "/dataset/hub"),
        ({"hub": "org/set", "name": "gsm8k"}, "/dataset/name"),
        ({"name": "gsm8k", "config": "main"}, "/dataset/config"),
    ],
)
def test_a_bad_hub_dataset_is_refused_at_submit(app_client: Any, dataset: dict[str, Any], pointer: str) -> None:
    from tests.helpers.api import admin_key

    spec = {"kind": "eval", "model": "org/m", "resources": {"gpus": 1}, "dataset": dataset}
    r = app_client.post("/v1/jobs", json=spec, headers=admin_key(app_client))
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == pointer, r.text


@pytest.mark.quick
def test_a_hub_dataset_is_admitted_without_fetching_it(app_client: Any) -> None:
    from tests.helpers.api import admin_key

    spec = {
        "kind": "eval",
        "model": "org/m",
        "resources": {"gpus": 1},
        "dataset": {"hub": "openai/gsm8k", "config": "main", "split": "test"},
    }
    r = app_client.post("/v1/jobs", json=spec, headers=admin_key(app_client))
    assert r.status_code == 201, r.text
    assert r.json()["resolved_config"]["recipe"]["name"] == "math-chat"


@pytest.mark.quick
def test_the_three_digit_set_is_fixed_true_and_disjoint_from_its_training_stream() -> None:
    """'arith3' (a benchmark added as one registry entry over a generator task, evaluator/benchmarks.py
    and evaluator/synthetic.py TASKS): three-digit additions in the tiny model's format."""
    import re

    from evaluator import synthetic
    from evaluator.benchmarks import find_benchmark
    from evaluator.data import load_benchmark

    held = load_benchmark(find_benchmark("arith3", "test"), None, None)
    assert len(held) == 300 and held == load_benchmark(find_benchmark("arith3", "test"), None, None)
    train = load_benchmark(find_benchmark("arith3-train", "train"), None, 2000)
    assert len(train) == 2000 and not {p.question for p in held} & {p.question for p in train}
    for p in held + train:
        a, b = (int(x) for x in re.fullmatch(r"(\d{3})\+(\d{3})=", p.question).groups())  # type: ignore[union-attr]
        assert int(p.gold) == a + b
    assert held != synthetic.heldout(task="add2")


@pytest.mark.quick
def test_an_items_file_makes_each_prompt_from_its_item_and_its_grader_reads_the_item(tmp_path: Path) -> None:
    """OpenAI's evals JSONL (format 'items'): a line is {"item": {...}} or the item alone; the prompt is
    the run's template filled from the item (a developer message is the system one), or the messages
    the item holds; the eval's grader reads the item's fields and a multi grader's parts are kept."""
    from evaluator.backends.base import Generation
    from evaluator.data import load_custom_set
    from evaluator.recipes import get_recipe
    from evaluator.scoring import score
    from mathrl.specs import DatasetRef

    path = write_jsonl(
        tmp_path / "items.jsonl",
        [{"item": {"q": "1 + 1?", "a": "2"}}, {"q": "2 + 3?", "a": "5", "chat": [{"role": "user", "content": "hi"}]}],
    )
    template = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Q: {{item.q}}"}]
    problems = load_custom_set(DatasetRef(path=str(path), format="items", template=template))
    assert [p.meta["messages"] for p in problems] == [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: 1 + 1?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: 2 + 3?"}],
    ]
    assert problems[0].meta["item"] == {"q": "1 + 1?", "a": "2"}
    held = load_custom_set(DatasetRef(path=str(path), format="items", messages_field="q"))
    assert held[0].meta["messages"] == [{"role": "user", "content": "1 + 1?"}]
    with pytest.raises(ValueError, match="line 1: the prompt could not be made"):
        load_custom_set(DatasetRef(path=str(path), format="items", messages_field="chat"))
    with pytest.raises(ValueError, match="template"):
        DatasetRef(path=str(path), format="items")
    with pytest.raises(ValueError, match="sample"):
        DatasetRef(path=str(path), format="items", template=[{"role": "user", "content": "{{sample.output_text}}"}])

    check = {"type": "string_check", "input": "{{sample.output_text}}", "reference": "{{item.a}}", "operation": "eq"}
    grader = {"type": "multi", "graders": {"c0": check}, "calculate_output": "c0"}
    spec = EvalSpec(model="org/m", dataset={"path": str(path), "format": "items", "template": template}, grader=grader)
    gens = [[Generation("2", 1, False)], [Generation("6", 1, False)]]
    scored = score(spec, get_recipe("plain"), problems, ["p0", "p1"], gens, 1.0)
    assert [i["data"]["grader_sub"] for i in scored.items] == [{"c0": 1.0}, {"c0": 0.0}]
