"""Eval jobs and generation on real models: a MATH-500 eval job through the service, a hub dataset
loaded through `datasets`, the HF greedy loop against `generate`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from evaluator.metrics import wilson_interval
from tests.helpers.env import shared_rows
from tests.helpers.service import Service

HUB_CHECK = """
import json, sys
from mathrl.specs import DatasetRef
from evaluator.data import load_custom_set
def run(**ref):
    try:
        return [p.gold for p in load_custom_set(DatasetRef.model_construct(**{"name": None, "path": None,
            "config": None, "split": "train", "question_field": "question", "answer_field": "answer",
            "limit": None, **ref}))]
    except ValueError as exc:
        return str(exc)
fields = {"question_field": "problem", "answer_field": "solution"}
print(json.dumps({
    "repo": run(hub="org/set", split="test", **fields),
    "split": run(hub="org/set", split="dev", **fields),
    "field": run(hub="org/set", split="test"),
    "missing": run(hub="openai/gsm8k", config="main", split="test"),
    "leak": run(hub="attacker/leak", **fields),
    "probe": run(hub="attacker/probe", **fields),
    "beside": run(hub="attacker/beside", **fields),
    "second": run(hub="attacker/second", **fields),
    "scheme": run(hub="attacker/scheme", **fields),
    "local": run(hub="attacker/local", **fields),
}))
"""


@pytest.mark.slow
def test_math500_eval_job_stores_breakdowns_with_provenance(service: Service, tiny_model: str) -> None:
    c = service.client()
    job = c.jobs.create(
        {
            "kind": "eval",
            "model": tiny_model,
            "benchmark": "math500",
            "limit": 6,
            "batch_size": 6,
            "sampling": {"max_new_tokens": 8},
        }
    )
    done = c.jobs.wait(job.id, timeout=180)
    assert done.status == "succeeded", done.error
    scores = {s.metric: s for s in c.scores.list(job_id=job.id)}
    rows = shared_rows("math500_test.jsonl", 6)
    want: dict[str, int] = {}
    for r in rows:
        want[f"accuracy/subject={r['subject']}"] = want.get(f"accuracy/subject={r['subject']}", 0) + 1
        want[f"accuracy/level={r['level']}"] = want.get(f"accuracy/level={r['level']}", 0) + 1
    groups = {m: s for m, s in scores.items() if m.startswith("accuracy/")}
    assert set(groups) == set(want)
    correct_by_problem = {s.data["problem"]: s.data["correct"] for s in c.jobs.samples(job.id)}
    head = scores["accuracy"]
    for metric, s in groups.items():
        assert s.n == want[metric]
        key, value = metric.removeprefix("accuracy/").split("=", 1)
        members = [i for i, r in enumerate(rows) if str(r[key]) == value]
        hits = sum(correct_by_problem[i] for i in members)
        assert math.isclose(s.value, hits / len(members))
        assert (s.ci_low, s.ci_high) == pytest.approx(wilson_interval(hits, len(members)))
        # the same provenance as the headline score
        for col in (
            "model_ref",
            "benchmark",
            "benchmark_version",
            "sampling",
            "backend",
            "backend_version",
            "prompt_hash",
            "seed",
            "checkpoint",
        ):
            assert getattr(s, col) == getattr(head, col), col
    assert head.n == 6 and head.benchmark == "math500" and head.model_ref == tiny_model
    assert sum(s.n for m, s in groups.items() if m.startswith("accuracy/level=")) == 6


def card(*patterns: str, second: str | None = None) -> str:
    """A dataset card (README.md) whose default config's train split is `patterns`, and, with
    `second`, a second config whose train split is that."""
    paths = "".join(f"\n    - '{p}'" for p in patterns)
    text = f"---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path:{paths}\n"
    if second is not None:
        text += f"- config_name: other\n  data_files:\n  - split: train\n    path: '{second}'\n"
    return text + "---\n"


def test_a_hub_dataset_loads_through_datasets_and_reads_only_its_own_files(tmp_path: Path) -> None:
    """dataset.hub goes through `datasets`' hub code (a hub on loopback: tests/helpers/fake_hub.py),
    and what cannot be loaded fails naming the spec field, before any work. A card is the
    repository owner's to write. Before: a hub id that was also a directory under the worker's
    working directory was read from there (`attacker/local`: project A's row, ['7']); a card whose
    data_files globbed the worker's disk (`attacker/leak`: every project's eval results) was
    refused by `datasets` only where the glob matched, and "No (supported) data files found"
    where it did not (`attacker/probe`); a miss beside the card's own file was dropped and the rows
    came back (`attacker/beside`), and another config than the one asked for was never globbed
    (`attacker/second`): which told the caller what exists on the worker. Now the card is read
    first and a path out of the repository is refused before anything is globbed, the same answer
    whatever the disk holds, naming no path."""
    import os
    import subprocess
    import sys

    from tests.helpers.env import ROOT
    from tests.helpers.fake_hub import FakeHub

    rows = shared_rows("gsm8k_test.jsonl", 3)
    honest = tmp_path / "hub" / "org-set"
    (honest / "data").mkdir(parents=True)
    (honest / "data" / "test.jsonl").write_text(
        "".join(json.dumps({"problem": r["question"], "solution": r["answer"]}) + "\n" for r in rows)
    )
    other = tmp_path / "artifacts" / "jobs" / "job-of-project-a" / "eval" / "items.jsonl"
    other.parent.mkdir(parents=True)
    other.write_text(json.dumps({"problem": "project A's question", "solution": "#### 7"}) + "\n")
    glob = f"{tmp_path}/artifacts/jobs/*/eval/items.jsonl"
    cards = {
        "leak": card(glob),
        "probe": card("/nonexistent/*.jsonl"),
        "beside": card("x.jsonl", "/nonexistent/*.jsonl"),  # a miss beside its own file was dropped: rows came back
        "second": card("x.jsonl", second=glob),  # another config than the one asked for: globbed only when asked
        "scheme": card("x.jsonl", "file:/nonexistent/*.jsonl"),  # fsspec's file: and local: glob the disk too
    }
    repos = {}
    for name, text in cards.items():
        repo = repos[f"attacker/{name}"] = tmp_path / "hub" / name
        repo.mkdir(parents=True)
        (repo / "README.md").write_text(text)
        (repo / "x.jsonl").write_text(json.dumps({"problem": "own", "solution": "#### 1"}) + "\n")
    cwd = tmp_path / "worker-cwd"
    (cwd / "attacker" / "local").mkdir(parents=True)  # a directory named like a hub id, where the worker runs
    (cwd / "attacker" / "local" / "x.jsonl").write_text(other.read_text())
    with FakeHub(datasets={"org/set": honest, **repos}) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ROOT)}
        env |= {"HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"}
        out = subprocess.run(
            [sys.executable, "-c", HUB_CHECK], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
        )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["repo"] == [r["answer"].split("####")[-1].strip() for r in rows]
    assert any("/resolve/" in c and c.endswith("/data/test.jsonl") for c in hub.calls), hub.calls  # from the hub
    assert got["split"].startswith("dataset.split:") and "'dev'" in got["split"], got["split"]
    assert got["field"].startswith("dataset.question_field:") and "'problem'" in got["field"], got["field"]
    assert got["missing"].startswith("dataset.hub: the hub dataset 'openai/gsm8k'"), got["missing"]
    refused = "names data files outside its repository"
    for name in cards:  # refused before anything is globbed: the same answer whatever the worker's disk holds
        assert got[name] == got["leak"].replace("attacker/leak", f"attacker/{name}"), (name, got[name])
    assert isinstance(got["leak"], str) and refused in got["leak"], got["leak"]
    # a directory of the worker's, named like a hub id: the hub is asked, not the directory (before: ['7'])
    assert isinstance(got["local"], str) and got["local"].startswith("dataset.hub: the hub dataset 'attacker/local'")
    assert str(tmp_path) not in out.stdout


def test_greedy_batches_drop_finished_rows_and_keep_generates_text(smollm2: str) -> None:
    """The HF backend's greedy loop (rows leave the batch as they end) gives the completions
    `model.generate` gives for the same left-padded batch, stop strings included."""
    import torch

    from evaluator.backends import Decoding, hf_generate
    from evaluator.models import load_model, load_tokenizer

    model, tok = load_model(smollm2), load_tokenizer(smollm2)
    prompts = ["The capital of France is", "Count to thirty: 1, 2, 3, 4,", "Question: what is 2 plus 3?\nAnswer:"]
    stop = ["."]
    ours = hf_generate.generate(model, tok, prompts, Decoding(24, tuple(stop), batch_size=3))

    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(
            **enc, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id, stop_strings=stop, tokenizer=tok
        )
    ids = hf_generate.eos_ids(model, tok)
    for row, new in enumerate(out[:, enc["input_ids"].shape[1] :].tolist()):
        end = next((j for j, t in enumerate(new) if t in ids), len(new))
        expected, stopped = hf_generate.cut_at_stop(tok.decode(new[:end], skip_special_tokens=True), stop)
        assert ours[row][0].text == expected, (row, ours[row][0].text, expected)
        assert ours[row][0].truncated == (end == len(new) and not stopped)
    assert sorted(g[0].truncated for g in ours) == [False, False, True], ours  # two rows left early
