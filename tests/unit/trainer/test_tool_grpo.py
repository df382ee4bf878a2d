"""GRPO with the python tool (issue 67.2), on the hf backend and the tiny model: taught in a few
seconds to call the tool for each of three questions and to answer after its output, one GRPO step
runs its rollouts through the tool's sandbox. The tool's tokens come back into each rollout's
context, are left out of the loss (no gradient reaches their log-probabilities, with every
advantage forced to 1), and the rollout's graded text is the model's own words. A rollout's budget
counts the tool's tokens; the spec refuses the paths that cannot run tools, naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mathrl.specs import parse_spec
from tests.unit.evaluator.test_sandbox import boundary  # noqa: F401  (the fixture)
from tests.unit.evaluator.test_tool_eval import QUESTIONS, _teach

pytestmark = pytest.mark.slow  # the tiny model, taught and trained


def taught_model(tmp_path: Path, hidden_size: int = 64, heads: int = 4) -> tuple[Path, Path]:
    """A tiny Llama that answers each question by a code block, its output, then a boxed answer
    (and its question set); vLLM's CPU attention takes heads 32 wide and up (hidden_size 128, heads 2)."""
    from evaluator.models import load_tokenizer
    from evaluator.prompts import as_recipe
    from evaluator.tool_formats import FORMATS
    from trainer.data import load_problems, render_prompt
    from trainer.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", hidden_size=hidden_size, layers=2, heads=heads, chat=True, arch="llama")
    data = tmp_path / "set.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {q}?", "answer": a}) + "\n" for q, a in QUESTIONS))
    problems, template = load_problems(parse_spec(tool_job(model, data)).dataset, None)
    recipe = FORMATS["code-blocks"].recipe_for(as_recipe(template))
    tok = load_tokenizer(str(model))
    traces = [
        render_prompt(p, recipe, tok)
        + f"```python\nprint({q})\n```\n```output\n{a}\n```\nThe answer is \\boxed{{{a}}}.<eos>"
        for p, (q, a) in zip(problems, QUESTIONS, strict=True)
    ]
    _teach(model, traces, lr=1e-2 if hidden_size <= 64 else 3e-3)
    return model, data


def tool_job(model: Path, data: Path, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "grpo",
        "model": str(model),
        "dataset": {"path": str(data), "question_field": "question", "answer_field": "answer"},
        "max_steps": 1,
        "num_generations": 2,
        "per_device_train_batch_size": 6,
        "max_completion_length": 128,
        "temperature": 0.3,
        "save_steps": 10**6,
        "logging_steps": 1,
        "generation": {"backend": "hf"},
        "tools": {"python": {"max_calls": 2, "timeout_s": 5}},
        **extra,
    }


def run_tool_job(model: Path, data: Path, out: Path, heldout: Path | None = None, **extra: Any) -> Any:
    """`tool_job` through `run_grpo`, as a worker runs it: what it recorded (a RecordSink). With
    `heldout`, a messages file scored after the step (`eval.file`, as the worker resolves one)."""
    from kinds import resolve_config
    from mathrl.specs.resolved import ResolvedGRPO
    from service.gpu_figures import RecordSink
    from trainer.grpo import run_grpo

    if heldout is not None:
        extra["eval"] = {"file": "file-" + "0" * 32, "every": 1, "max_new_tokens": 48}
    spec = parse_spec(tool_job(model, data, **extra))
    if heldout is not None:
        spec.eval._path = str(heldout)  # type: ignore[union-attr]
    sink = RecordSink(echo=False)
    run_grpo(spec, resolve_config(spec).of(ResolvedGRPO), sink, model_path=str(model), data_dir=None, out_dir=out)
    return sink


def test_a_grpo_step_calls_the_tool_and_trains_only_on_the_models_tokens(
    boundary: Any,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from trainer.grpo_loop import MathrlGRPOTrainer

    model, data = taught_model(tmp_path)
    seen: dict[str, Any] = {}
    compute_loss = MathrlGRPOTrainer._compute_loss

    def spy(self: Any, net: Any, inputs: dict[str, Any]) -> Any:
        """The training loss with every advantage 1, keeping the gradient of each token's log-probability."""
        forward = self._get_per_token_logps_and_entropies

        def kept(*args: Any, **kwargs: Any) -> Any:
            logps, entropies, aux = forward(*args, **kwargs)
            if kwargs.get("compute_entropy"):  # the training forward
                logps.retain_grad()
                seen["logps"] = logps
            return logps, entropies, aux

        inputs = {**inputs, "advantages": torch.ones_like(inputs["advantages"])}
        seen["inputs"] = inputs
        self._get_per_token_logps_and_entropies = kept
        try:
            return compute_loss(self, net, inputs)
        finally:
            del self._get_per_token_logps_and_entropies

    monkeypatch.setattr(MathrlGRPOTrainer, "_compute_loss", spy)
    heldout = _heldout_file(model, tmp_path / "heldout.jsonl")
    sink = run_tool_job(model, data, tmp_path / "out", heldout, rewards=[{"name": "accuracy"}])

    from evaluator.models import load_tokenizer

    tok = load_tokenizer(str(model))
    inputs = seen["inputs"]
    tool = inputs["tool_mask"] * inputs["completion_mask"]
    outputs = inputs["completion_mask"] - tool  # the tool's tokens in each rollout
    assert outputs.sum() > 0, "no rollout called the tool"
    for row, ids in zip(outputs, inputs["completion_ids"], strict=True):
        if row.any():  # the tool's tokens, as the sandbox computed them, after the model's ```output
            text = tok.decode(ids[row.bool()].tolist())
            assert any(f"\n{a}\n```\n" in text for _, a in QUESTIONS), text
    grad = seen["logps"].grad
    assert grad is not None
    assert torch.all(grad[outputs.bool()] == 0), "a gradient reached the tool's tokens"
    assert torch.all(grad[tool.bool()] != 0), "a model token got no gradient"
    step = sink.metrics_by_step[1]
    assert step["tool/calls_per_rollout"] >= 1.0 and step["tool/call_errors"] == 0.0, step
    assert step["tool_seconds"] > 0 and 0 < step["tool_share"] < 1, step
    assert step["rewards/accuracy/mean"] > 0, step  # graded on the answer after the output
    # the held-out answers called the tool too: graded on the words after its output, they are right
    held = next(e for e in sink.events if e["type"] == "heldout")
    assert "with the tool" in held["data"]["backend"] and held["data"]["heldout/reward"] > 0, held


def test_a_grpo_step_with_the_tool_decodes_on_the_static_cache_copy_too(
    boundary: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """hf_mode 'static' (trainer/hf_generation.py): each turn decodes on the policy's decode copy with a
    fixed-size cache, stopping at the call as the dynamic path does."""
    model, data = taught_model(tmp_path)
    sink = run_tool_job(
        model, data, tmp_path / "out", rewards=[{"name": "accuracy"}], generation={"backend": "hf", "hf_mode": "static"}
    )
    gen = next(e for e in sink.events if e["type"] == "generation")
    assert gen["data"]["hf_mode"] == "static", gen
    step = sink.metrics_by_step[1]
    assert step["tool/calls_per_rollout"] >= 1.0 and step["tool/call_errors"] == 0.0, step
    assert step["rewards/accuracy/mean"] > 0, step  # the answer after the output, graded


def _heldout_file(model: Path, path: Path) -> Path:
    """The taught questions as an uploaded messages file (OpenAI's validation format), its chats as
    the tool recipe renders them (a chat is rendered as its author wrote it)."""
    from evaluator.prompts import as_recipe, messages
    from evaluator.tool_formats import FORMATS

    recipe = FORMATS["code-blocks"].recipe_for(as_recipe("math-chat"))
    lines = [json.dumps({"messages": messages(recipe, f"What is {q}?"), "answer": a}) + "\n" for q, a in QUESTIONS]
    path.write_text("".join(lines))
    return path


def test_a_rollouts_budget_counts_the_tools_tokens() -> None:
    from evaluator.tool_formats import FORMATS
    from trainer.tool_grpo import TokenRollout, cut_at

    class Chars:
        """A character tokenizer: one id per character."""

        def __call__(self, text: str, add_special_tokens: bool = False) -> Any:
            return type("Enc", (), {"input_ids": [ord(c) for c in text]})()

        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return "".join(chr(i) for i in ids)

    tok = Chars()
    fmt = FORMATS["code-blocks"]
    turn = tok("```python\nprint(1)\n```\n```output and on").input_ids
    cut = cut_at(turn, tok, fmt.call_stop)
    assert (
        cut is not None and tok.decode(turn[: cut[0]]).endswith("```output") and cut[1] == "```python\nprint(1)\n```\n"
    )
    r = TokenRollout("q", budget=cut[0] + 4, tokenizer=tok, call_stop=fmt.call_stop)
    r.ids, r.mask = turn[: cut[0]], [1] * cut[0]
    r.receive(fmt.returned(cut[1], "12345678"))
    assert r.ids[cut[0] :] == tok("\n123").input_ids and r.mask[cut[0] :] == [0] * 4  # cut at the budget
    assert r.done and r.truncated


def test_the_spec_refuses_tools_where_they_cannot_run(tmp_path: Path) -> None:
    job = tool_job(tmp_path / "m", tmp_path / "d.jsonl")
    for extra, match in (
        ({"generation": {"backend": "hf", "overlap": True}}, "overlap decodes single turns"),
        ({"generation": {"backend": "hf", "hf_mode": "continuous"}}, "continuous batching has no stop string"),
        ({"generation": {"backend": "vllm", "mode": "server"}, "lora": {"r": 8}}, "generation.mode='colocate'"),
    ):
        with pytest.raises(ValueError, match=match):
            parse_spec({**job, **extra})
    assert parse_spec({**job, "generation": {"backend": "vllm"}}).tools is not None
    with pytest.raises(ValueError, match="void_turn_penalty is for void_turns='penalize'"):
        parse_spec({**job, "tools": {"void_turn_penalty": 2.0}})
    assert parse_spec({**job, "tools": {"void_turns": "penalize", "void_turn_penalty": 2.0}}).tools is not None
    evaluation = {"kind": "eval", "model": "org/m", "tools": {"void_turns": "drop"}}
    with pytest.raises(ValueError, match="void_turns is how GRPO trains"):
        parse_spec(evaluation)


@pytest.mark.quick
def test_the_api_takes_tools_on_grpo_and_points_at_what_it_refuses(app_client: Any) -> None:
    from tests.helpers.api import admin_key

    h = admin_key(app_client)
    job = {
        "kind": "grpo",
        "model": "org/model",
        "dataset": {"name": "gsm8k"},
        "max_steps": 1,
        "resources": {"pool": "objects-parked"},
        "tools": {"python": {"max_calls": 2}},
    }
    for extra, pointer in (
        ({"generation": {"backend": "hf", "overlap": True}}, "/tools"),
        ({"tools": {"void_turns": "skip"}}, "/tools/void_turns"),
        ({"tools": {"void_turn_penalty": 2.0}}, "/tools/void_turn_penalty"),
    ):
        r = app_client.post("/v1/jobs", json={**job, **extra}, headers=h)
        assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == pointer, r.text
    r = app_client.post("/v1/jobs", json=job, headers=h)
    assert r.status_code == 201 and r.json()["spec"]["tools"]["python"]["max_calls"] == 2, r.text
    evaluation = {"kind": "eval", "model": "org/model", "limit": 1, "resources": {"pool": "objects-parked"}}
    r = app_client.post("/v1/jobs", json={**evaluation, "tools": {"void_turns": "drop"}}, headers=h)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/tools/void_turns", r.text


@pytest.mark.quick
def test_the_tool_traces_compute_their_answers_and_hold_no_heldout_problem(tmp_path: Path) -> None:
    import re

    from evaluator.benchmarks import get_benchmark
    from evaluator.data import load_benchmark
    from evaluator.models import load_tokenizer
    from evaluator.tool_formats import FORMATS
    from trainer.sft import sft_dataset
    from trainer.tiny import build_tiny_model

    held = {p.question for p in load_benchmark(get_benchmark("twostep-words"), None)}
    fmt = FORMATS["code-blocks"]
    tool = load_benchmark(get_benchmark("twostep-words-tool-traces"), None, 200)
    text = load_benchmark(get_benchmark("twostep-words-text-traces"), None, 200)
    assert [p.question for p in tool] == [p.question for p in text] and not held & {p.question for p in tool}
    for p, q in zip(tool, text, strict=True):
        assert p.solution is not None and q.solution is not None
        code = fmt.call_in(p.solution.split(fmt.call_stop)[0])
        assert code is not None and str(eval(code.removeprefix("print(").rstrip().removesuffix(")"))) == p.gold
        assert p.solution.endswith(f"The answer is {p.gold}.") and q.solution.endswith(f"The answer is {p.gold}.")
        assert all(
            int(a) + (int(b) if o == "+" else -int(b)) == int(c)
            for a, o, b, c in re.findall(r"(\d+) ([+-]) (\d+) = (\d+)", q.solution)
        )
    model = build_tiny_model(tmp_path / "tiny", chat=True, arch="llama")
    tok = load_tokenizer(str(model))
    job = {"kind": "sft", "model": str(model), "dataset": {"name": "twostep-words-tool-traces", "limit": 2}}
    with_tool = sft_dataset(parse_spec({**job, "tools": {}}), tok, None)
    plain = sft_dataset(parse_spec(job), tok, None)
    assert fmt.instruction in with_tool[0]["prompt"] and fmt.instruction not in plain[0]["prompt"]
    assert with_tool[0]["completion"].startswith("```python\nprint(")
