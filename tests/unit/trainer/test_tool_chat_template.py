"""The chat template's own tool calls (issue 67.1, format `chat-template`), on the tiny model with
Qwen2.5's template (the python tool's schema in its system turn; TRL's response parser reads the
calls): taught once to call the tool for each of three questions, it is evaluated with the tool and
trained one GRPO step with it. Each call is parsed from the model's JSON, runs in the tool's sandbox,
and its output comes back as the template's tool message, out of the loss."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.evaluator.test_sandbox import boundary  # noqa: F401  (the fixture)
from tests.unit.evaluator.test_tool_eval import QUESTIONS, _teach, chat_tool_model, chat_tool_traces
from tests.unit.trainer.test_tool_grpo import run_tool_job

pytestmark = pytest.mark.slow  # the tiny model taught on prompts of some 1,000 characters


def taught_chat_model(tmp: Path, hidden_size: int = 64, heads: int = 4) -> tuple[Path, Path]:
    """The tiny model taught to call the python tool through Qwen2.5's template for each question,
    and the question set (about 250 steps; vLLM's CPU attention needs hidden_size 128, heads 2)."""
    from mathrl.recipe import Recipe

    model = chat_tool_model(tmp, hidden_size=hidden_size, heads=heads)
    data = tmp / "set.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {q}?", "answer": a}) + "\n" for q, a in QUESTIONS))
    # the recipe both jobs resolve for a custom set: math-chat's, whose system text the tool joins
    from evaluator.prompts import as_recipe

    recipe = as_recipe("math-chat")
    assert isinstance(recipe, Recipe)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    traces = chat_tool_traces(model, recipe)
    # each prompt ends with the assistant's header, where the call begins
    header = "<|im_start|>assistant\n"
    head = min(len(tok(t[: t.index(header) + len(header)]).input_ids) for t in traces)
    _teach(model, traces, until=0.01, prompts=head, lr=1e-2 if hidden_size <= 64 else 3e-3)
    return model, data


# the chat-template format's GRPO job: the schema and the template's tool text are some 900 characters
CHAT_TOOL_JOB: dict[str, Any] = {
    "max_completion_length": 256,
    "max_prompt_length": 1024,
    "tools": {"format": "chat-template", "python": {"max_calls": 2, "timeout_s": 5}},
}


@pytest.fixture(scope="module")
def taught(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The taught model and its question set (one teaching for both tests)."""
    return taught_chat_model(tmp_path_factory.mktemp("chat-tools"))


def test_an_eval_with_the_chat_templates_calls_parses_them_and_answers_after_the_tool_message(
    boundary: Any,  # noqa: F811
    taught: tuple[Path, Path],
) -> None:
    from evaluator.run import run_eval
    from mathrl.specs import EvalSpec
    from runtime.sink import PrintSink

    model, data = taught
    spec = EvalSpec.model_validate(
        {
            "model": str(model),
            "dataset": {"path": str(data), "question_field": "question", "answer_field": "answer"},
            "sampling": {"max_new_tokens": 128},  # a call's JSON is some 80 characters
            "tools": {"format": "chat-template", "python": {"max_calls": 2, "timeout_s": 5}},
        }
    )
    sink = PrintSink()
    values = run_eval(spec, sink, model_path=str(model), data_dir=None)
    turns = [item["data"]["tool_turns"] for item in sink.items]
    assert [t[0]["code"] for t in turns] == [f"print({q})" for q, _ in QUESTIONS], turns  # parsed from the JSON
    assert [t[0]["output"] for t in turns] == [a for _, a in QUESTIONS], turns  # computed in the sandbox
    first = sink.items[0]
    assert '"name": "python"' in first["prompt"], first["prompt"]  # the schema, where the template puts it
    assert "<tool_response>\n391\n</tool_response>" in first["completion"], first["completion"]
    assert values["accuracy"] == 1.0 and values["tool/calls_per_rollout"] == 1.0, values
    assert values["tool/void_turns"] == 0.0 and values["tool/answered"] == 1.0, values


def test_a_grpo_step_with_the_chat_templates_calls_keeps_the_tool_message_out_of_the_loss(
    boundary: Any,  # noqa: F811
    taught: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from evaluator.models import load_tokenizer
    from trainer.grpo_loop import MathrlGRPOTrainer

    model, data = taught
    seen: dict[str, Any] = {}
    compute_loss = MathrlGRPOTrainer._compute_loss

    def spy(self: Any, net: Any, inputs: dict[str, Any]) -> Any:
        seen["inputs"] = inputs
        return compute_loss(self, net, inputs)

    monkeypatch.setattr(MathrlGRPOTrainer, "_compute_loss", spy)
    sink = run_tool_job(
        model,
        data,
        tmp_path / "out",
        rewards=[{"name": "accuracy"}],
        **CHAT_TOOL_JOB,
    )
    tok = load_tokenizer(str(model))
    inputs = seen["inputs"]
    tool = inputs["completion_mask"] * (1 - inputs["tool_mask"])  # the tool's tokens in each rollout
    assert tool.sum() > 0, "no rollout called the tool"
    for row, ids in zip(tool, inputs["completion_ids"], strict=True):
        if row.any():  # the template's tool message with the sandbox's output, then the next assistant header
            text = tok.decode(ids[row.bool()].tolist())
            assert any(f"<tool_response>\n{a}\n</tool_response>" in text for _, a in QUESTIONS), text
            assert text.rstrip().endswith("<|im_start|>assistant"), text
    step = sink.metrics_by_step[1]
    assert step["tool/calls_per_rollout"] >= 1.0 and step["tool/call_errors"] == 0.0, step
    assert step["rewards/accuracy/mean"] > 0, step  # graded on the answer after the tool message


def test_a_chat_with_functions_answers_with_the_models_call_then_its_answer_after_the_result(
    taught: tuple[Path, Path],
) -> None:
    """Issue 69.2: a model trained with a python tool answers a chat with `tools` as OpenAI's do. Offered
    the function, the taught model's call comes back as the message's tool_calls (finish_reason
    'tool_calls'), in the shape the `openai` package reads; the caller runs it and sends the result back
    as a tool message, and the model answers after it. Nothing runs here: the caller runs its functions."""
    from openai.types.chat import ChatCompletion

    from api.openai.completion_views import completion_object
    from evaluator import prompts
    from evaluator.chat import run_generate
    from evaluator.models import load_tokenizer
    from evaluator.tool_formats import PYTHON_SCHEMA, tool_format
    from mathrl.specs import GenerateSpec
    from tests.unit.evaluator.test_chat import Recorded

    model, _ = taught
    fmt = tool_format("chat-template", load_tokenizer(str(model)))
    recipe = fmt.recipe_for(prompts.as_recipe("math-chat"))  # type: ignore[arg-type]
    chat = prompts.messages(recipe, f"What is {QUESTIONS[0][0]}?")
    ask = {"model": str(model), "function_tools": [PYTHON_SCHEMA], "temperature": 0, "max_tokens": 128}
    sink = Recorded()
    run_generate(GenerateSpec.model_validate({**ask, "messages": chat}), sink, str(model))
    answer = ChatCompletion.model_validate(completion_object("0" * 32, "ft:m", [_row(sink.rows[0])], chat=True))
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "python" and json.loads(call.function.arguments) == {"code": "print(17 * 23)"}
    assert call.id.startswith("call_"), call
    turn = {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]}
    result = {"role": "tool", "tool_call_id": call.id, "content": QUESTIONS[0][1]}
    sink = Recorded()
    run_generate(GenerateSpec.model_validate({**ask, "messages": [*chat, turn, result]}), sink, str(model))
    row = sink.rows[0]
    assert f"<tool_response>\n{QUESTIONS[0][1]}\n</tool_response>" in row["prompt"], row["prompt"]  # rendered back
    assert row["data"]["finish_reason"] == "stop" and "tool_calls" not in row["data"], row
    assert row["completion"] == f"The answer is \\boxed{{{QUESTIONS[0][1]}}}.", row["completion"]
    sink = Recorded()  # tool_choice 'none': the model's call stays its text
    run_generate(GenerateSpec.model_validate({**ask, "messages": chat, "tool_choice": "none"}), sink, str(model))
    assert "tool_calls" not in sink.rows[0]["data"] and '"python"' in sink.rows[0]["completion"], sink.rows[0]


def _row(sample: dict[str, Any]) -> dict[str, Any]:
    """A stored sample as the route reads it (api/openai/generation_calls.py choices_of)."""
    return {"text": sample["completion"], **sample["data"]}


def test_a_chat_with_functions_on_a_model_whose_template_has_none_is_refused_naming_tools(tiny_model: str) -> None:
    from evaluator.chat import run_generate
    from mathrl.errors import FieldError
    from mathrl.specs import GenerateSpec
    from tests.unit.evaluator.test_chat import Recorded

    spec = GenerateSpec.model_validate(
        {
            "model": tiny_model,
            "messages": [{"role": "user", "content": "hi"}],
            "function_tools": [{"type": "function", "function": {"name": "f"}}],
        }
    )
    with pytest.raises(FieldError, match="renders no tool calls") as refused:
        run_generate(spec, Recorded(), tiny_model)
    assert refused.value.field == "tools"
