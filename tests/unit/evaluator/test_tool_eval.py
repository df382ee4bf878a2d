"""An eval with the python tool (issue 67.4), on the hf backend and the tiny model: taught in a few
seconds to write a code block for each of three questions and to answer after the output, it is
then evaluated with `tools`. Each rollout's call runs in the tool's sandbox, the computed output
comes back into its context, the answer after it is graded, and the turns and the tool's metrics
are kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.evaluator.test_sandbox import boundary  # noqa: F401  (the fixture)

pytestmark = pytest.mark.quick

QUESTIONS = [("17 * 23", "391"), ("2 ** 10 - 1", "1023"), ("sum(range(12))", "66")]


def _teach(
    path: Path, texts: list[str], steps: int = 400, lr: float = 1e-2, until: float = 0.005, prompts: int = 0
) -> None:
    """Fit the tiny model to `texts` (prompt and completion as one sequence) until it repeats them
    (its mean loss under `until`). With `prompts`, each text's first that many tokens (the prompts' shortest
    length) carry no loss, so that the mean is the completion's: over a long shared prompt, a low mean still
    left one question's call unlearnt (the twenty-third session's suite run: 2 of 3 questions called)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    batch = tok(texts, return_tensors="pt", padding=True)
    labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
    if prompts:
        assert tok.padding_side == "right", tok.padding_side
        labels[:, :prompts] = -100
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(0)
    for _ in range(steps):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if loss.item() < until:
            break
    model.save_pretrained(path)


def test_an_eval_with_the_python_tool_calls_it_and_grades_the_answer_after(boundary: Any, tmp_path: Path) -> None:  # noqa: F811
    from evaluator import prompts
    from evaluator.models import load_tokenizer
    from evaluator.recipes import resolve_recipe
    from evaluator.run import run_eval
    from evaluator.tool_formats import FORMATS
    from mathrl.specs import EvalSpec
    from runtime.sink import PrintSink
    from trainer.tiny import build_tiny_model

    # a Llama: transformers 5 loads a qwen2 model's tokenizer as Qwen2Tokenizer, which drops the
    # character tokenizer's spaces and newlines, and a code block needs both
    model = build_tiny_model(tmp_path / "tiny", hidden_size=64, layers=2, heads=4, chat=True, arch="llama")
    data = tmp_path / "set.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {q}?", "answer": a}) + "\n" for q, a in QUESTIONS))
    spec = EvalSpec.model_validate(
        {
            "model": str(model),
            "dataset": {"path": str(data), "question_field": "question", "answer_field": "answer"},
            "recipe": {"format": "chat", "question": "{question}"},
            "sampling": {"max_new_tokens": 48},
            "tools": {"python": {"max_calls": 2, "timeout_s": 5}},
        }
    )
    fmt = FORMATS["code-blocks"]
    tok = load_tokenizer(str(model))
    recipe = fmt.recipe_for(resolve_recipe(spec).recipe)
    traces = [
        prompts.render(recipe, f"What is {q}?", tok)
        + f"```python\nprint({q})\n```\n```output\n{a}\n```\nThe answer is \\boxed{{{a}}}.<eos>"
        for q, a in QUESTIONS
    ]
    _teach(model, traces)
    sink = PrintSink()
    values = run_eval(spec, sink, model_path=str(model), data_dir=None)
    items = sink.items
    turns = [item["data"]["tool_turns"] for item in items]
    assert [t[0]["code"].strip() for t in turns] == [f"print({q})" for q, _ in QUESTIONS], turns
    assert [t[0]["output"] for t in turns] == [a for _, a in QUESTIONS], turns  # computed in the sandbox
    assert all(t[-1] == {"answer": t[-1]["answer"]} and "boxed" in t[-1]["answer"] for t in turns), turns
    assert "```output\n391\n```" in items[0]["completion"], items[0]["completion"]
    assert values["accuracy"] == 1.0 and values["tool/calls_per_rollout"] == 1.0, values
    assert values["tool/call_errors"] == 0.0 and values["tool/answered"] == 1.0 and values["tool/void_turns"] == 0.0
    accuracy = next(s for s in sink.scores if s["metric"] == "accuracy")
    assert accuracy["sampling"]["tools"] == spec.tools.model_dump()  # type: ignore[union-attr]

    # an engine's length (vLLM's max_model_len) caps each turn at the room its context leaves: here
    # the longest rollout has 4 tokens left after its call's output, and none runs past the length
    from evaluator.backends import Decoding, backend
    from evaluator.python_tool import PythonTool, ToolLimits
    from evaluator.tool_rollouts import generate_with_tools

    def n_tokens(text: str) -> int:
        return len(tok(text, add_special_tokens=False).input_ids)

    texts = [item["prompt"] for item in items]
    out_end = [c.index("```\n", c.index("```output")) + 4 for c in (item["completion"] for item in items)]
    with_output = [n_tokens(t + item["completion"][:e]) for t, item, e in zip(texts, items, out_end, strict=True)]
    hf = backend("hf")
    loaded = hf.load(str(model), tok).model
    for length in (max(with_output) + 4, min(with_output)):
        with PythonTool(ToolLimits(timeout_s=5)) as tool:
            gens, _ = generate_with_tools(
                hf.generator(loaded, tok, max_model_len=length), texts,
                Decoding(48, tuple(recipe.stop), batch_size=8), tool=tool, fmt=fmt, max_calls=2,
            )  # fmt: skip
        for text, (g,) in zip(texts, gens, strict=True):
            # what the engine was asked and wrote stays within the length; an output that filled it is
            # never sent (its rollout ends there, no turn asked)
            asked = g.text[: g.text.rindex("```output")] if g.tool_turns[-1] == {"answer": ""} else g.text
            assert n_tokens(text + asked) <= length and g.truncated, (length, g)
        longest = gens[with_output.index(max(with_output))][0]
        if length > max(with_output):  # its call ran, and its answer was cut at the 4 tokens left
            assert longest.tool_turns[0]["output"] == QUESTIONS[with_output.index(max(with_output))][1], longest
            assert 0 < n_tokens(longest.tool_turns[-1]["answer"]) <= 4, longest
        else:  # the shortest filled the length with its output: its rollout ends there, no turn asked
            shortest = gens[with_output.index(min(with_output))][0]
            assert shortest.tool_turns[-1] == {"answer": ""} and "code" in shortest.tool_turns[0], shortest


def test_the_specs_formats_are_the_evaluators() -> None:
    from typing import get_args

    from evaluator.tool_formats import FORMATS
    from mathrl.specs.tools import TOOL_FORMATS, Tools

    assert set(FORMATS) == set(TOOL_FORMATS) == set(get_args(Tools.model_fields["format"].annotation))


def test_a_tools_block_is_checked_naming_its_field(app_client: Any) -> None:
    from tests.helpers.api import admin_key

    h = admin_key(app_client)
    base = {"kind": "eval", "model": "org/model", "limit": 1, "resources": {"pool": "objects-parked"}}
    for tools, pointer in (
        ({"format": "json-calls"}, "/tools/format"),
        ({"python": {"max_calls": 0}}, "/tools/python/max_calls"),
        ({"python": {"timeout_s": 600}}, "/tools/python/timeout_s"),
        ({"shell": {}}, "/tools/shell"),
    ):
        r = app_client.post("/v1/jobs", json={**base, "tools": tools}, headers=h)
        assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == pointer, r.text
    generate = {"kind": "generate", "model": "org/model", "prompt": "1+1?", "resources": {"pool": "objects-parked"}}
    for extra in ({"stream": True}, {"logprobs": 2}, {"backend": "vllm"}):
        r = app_client.post("/v1/jobs", json={**generate, **extra, "tools": {}}, headers=h)
        assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "/tools", r.text
    r = app_client.post("/v1/jobs", json={**generate, "tools": {}}, headers=h)
    assert r.status_code == 201, r.text
    r = app_client.post("/v1/jobs", json={**base, "tools": {"python": {"max_calls": 2}}}, headers=h)
    assert r.status_code == 201 and r.json()["spec"]["tools"]["python"]["max_calls"] == 2, r.text
    # the chat template's own calls, on a model whose template renders no tools (the tiny model's ChatML)
    r = app_client.post(
        "/v1/jobs", json={**base, "model": "tiny:2x64", "tools": {"format": "chat-template"}}, headers=h
    )
    assert r.status_code == 422, r.text
    error = r.json()["errors"][0]
    assert error["pointer"] == "/tools/format" and "code-blocks" in error["detail"], r.text
    r = app_client.post("/v1/jobs", json={**base, "tools": {"format": "chat-template"}}, headers=h)
    assert r.status_code == 201, r.text  # a hub model's template is the worker's to check


def test_a_generate_job_with_the_tool_answers_a_chat_after_the_output(boundary: Any, tmp_path: Path) -> None:  # noqa: F811
    from evaluator import prompts
    from evaluator.chat import run_generate
    from evaluator.models import load_tokenizer
    from evaluator.tool_formats import FORMATS
    from mathrl.recipe import Recipe
    from mathrl.specs import parse_spec
    from runtime.sink import PrintSink
    from trainer.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", hidden_size=64, layers=2, heads=4, chat=True, arch="llama")
    fmt = FORMATS["code-blocks"]
    tok = load_tokenizer(str(model))
    recipe = fmt.recipe_for(Recipe(format="chat", question="{question}"))  # what a chat gets: the instruction as system
    q, a = QUESTIONS[0]
    trace = f"```python\nprint({q})\n```\n```output\n{a}\n```\nThe answer is \\boxed{{{a}}}.<eos>"
    _teach(model, [prompts.render(recipe, f"What is {q}?", tok) + trace])
    spec = parse_spec(
        {
            "kind": "generate",
            "model": str(model),
            "messages": [{"role": "user", "content": f"What is {q}?"}],
            "max_tokens": 48,
            "temperature": 0.0,
            "tools": {"python": {"max_calls": 2}},
        }
    )
    sink = PrintSink()
    run_generate(spec, sink, str(model))
    (row,) = sink.items
    assert fmt.instruction in row["prompt"], row["prompt"]
    turns = row["data"]["tool_turns"]
    assert turns[0]["code"].strip() == f"print({q})" and turns[0]["output"] == a, turns  # run in the sandbox
    assert f"```output\n{a}\n```" in row["completion"] and "boxed{391}" in turns[-1]["answer"], row


def chat_tool_model(tmp_path: Path, hidden_size: int = 64, heads: int = 4) -> Path:
    """The tiny Llama with a chat template that carries tools: Qwen2.5's (TRL ships it, and its response
    parser), on the character tokenizer, whose end of sequence is then the template's <|im_end|> as an
    instruct model's is."""
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", hidden_size=hidden_size, layers=2, heads=heads, chat=True, arch="llama")
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    tok.eos_token = "<|im_end|>"
    tok.save_pretrained(model)
    net = AutoModelForCausalLM.from_pretrained(model)
    net.config.eos_token_id = net.generation_config.eos_token_id = tok.eos_token_id
    net.save_pretrained(model)
    return model


def chat_tool_traces(model: Path, recipe: Any) -> list[str]:
    """Each question's prompt (the python tool's schema in its system turn) and the trace the template
    writes: the assistant's tool call, the tool message with the output, the answer."""
    from evaluator import prompts
    from evaluator.models import load_tokenizer
    from evaluator.tool_formats import tool_format

    tok = load_tokenizer(str(model))
    fmt = tool_format("chat-template", tok)
    return [
        prompts.render(fmt.recipe_for(recipe), f"What is {q}?", tok, tools=fmt.chat_tools)
        + fmt.write_trace([(f"print({q})", a)], f"The answer is \\boxed{{{a}}}.")
        + tok.eos_token
        for q, a in QUESTIONS
    ]


def test_the_chat_template_format_refuses_a_template_without_tools_and_writes_traces_as_the_template_does(
    tmp_path: Path,
) -> None:
    from evaluator.models import load_tokenizer
    from evaluator.tool_formats import FORMATS, tool_format
    from mathrl.errors import FieldError
    from mathrl.recipe import Recipe
    from trainer.tiny import build_tokenizer

    with pytest.raises(FieldError) as refused:
        tool_format("chat-template", build_tokenizer(chat=True))  # ChatML without tools
    assert refused.value.field == "tools/format" and "code-blocks" in str(refused.value)
    tok = load_tokenizer(str(chat_tool_model(tmp_path)))
    fmt = tool_format("chat-template", tok)
    with pytest.raises(FieldError, match="chat recipe"):
        fmt.recipe_for(Recipe(format="text"))
    trace = FORMATS["code-blocks"].write_trace([("print(2 + 3)", "5")], "The answer is 5.")
    calls, answer = FORMATS["code-blocks"].read_trace(trace) or ([], "")
    written = fmt.write_trace(calls, answer)
    assert written.startswith('<tool_call>\n{"name": "python", "arguments": {"code": "print(2 + 3)"}}\n</tool_call>')
    turn = written.split(tok.eos_token)[0]
    assert fmt.call_in(turn) == "print(2 + 3)" and fmt.holds_call(turn)
    assert fmt.call_in('<tool_call>\n{"name": "python", "arguments": {"code": oops}}\n</tool_call>') is None
    assert fmt.call_in('<tool_call>\n{"name": "shell", "arguments": {"code": "ls"}}\n</tool_call>') is None
    assert fmt.without_outputs(written) == turn + "\nThe answer is 5.", written  # the model's own words
