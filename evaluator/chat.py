"""Answering chats and prompts with a model: the 'generate' job behind the OpenAI-compatible
POST /v1/chat/completions and /v1/completions (api/routers/openai_inference.py), a batch's lines
(OpenAI's Batch API), and the grading models of score_model and label_model graders (`judges`).
Every call goes through its backend's `Chat` (evaluator/backends: `backend(name).chat(...)`): the
worker's warm vLLM engine for `backend: vllm` (or 'auto' where the job was given one), else
transformers in the job's process. With `stream`, the text is stored as 'delta' events while it
is generated (at most every DELTA_SECONDS), which the API relays as server-sent events; the
choices themselves are the job's samples: text, finish_reason and token counts."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from evaluator.backends import BackendOptions, Decoding, backend
from evaluator.backends.base import WarmEngineAddress
from evaluator.backends.chat_base import Chat, Choice, ModelPath, NoDeltas, answer_schema, rows

if TYPE_CHECKING:
    from evaluator.backends.hf_chat import HFChat
    from evaluator.sandbox import SandboxLimits
    from mathrl.specs import GenerateSpec
    from runtime.sink import Sink

DELTA_SECONDS = 0.2  # the longest a streamed delta waits to be stored

log = logging.getLogger(__name__)


def chat_for(name: str, model_path: ModelPath, dtype: str = "auto", warm: WarmEngineAddress | None = None) -> Chat:
    """The model at `model_path` held for calls by the backend `name` ('auto': the warm engine the
    job was given, else transformers)."""
    chosen = ("vllm" if warm is not None else "hf") if name == "auto" else name
    return backend(chosen, BackendOptions(warm=warm)).chat(model_path, dtype=dtype)


class DeltaWriter:
    """Streamed text stored as 'delta' events, each holding what came in at most DELTA_SECONDS."""

    def __init__(self, sink: Sink):
        self.sink = sink
        self.pending: dict[int, str] = {}
        self.last = time.monotonic()

    def add(self, index: int, text: str) -> None:
        self.pending[index] = self.pending.get(index, "") + text
        if time.monotonic() - self.last >= DELTA_SECONDS:
            self.flush()

    def flush(self) -> None:
        for index, text in self.pending.items():
            if text:
                self.sink.event("delta", "", data={"index": index, "text": text})
        self.pending = {}
        self.last = time.monotonic()


def run_generate(
    spec: GenerateSpec,
    sink: Sink,
    model_path: str,
    warm: WarmEngineAddress | None = None,
    sandbox: SandboxLimits | None = None,
) -> None:
    """A generate job: its choices as samples (and 'delta' events while streaming), on its backend's
    `Chat` (`chat_for`). A batch: `run_batch`. With `tools`, rollouts with their calls in the job's
    tool sandbox (`sandbox`: the operator's graders settings)."""
    if spec.batch is not None:
        run_batch(spec, sink, model_path, warm)
        return
    chat = chat_for(spec.backend, model_path, spec.dtype, warm)
    deltas = DeltaWriter(sink)
    made = (
        _answer_with_tools(spec, sink, chat.here(), sandbox)
        if spec.tools is not None
        else chat.call(spec, sink, deltas)
    )
    deltas.flush()
    sink.samples(0, made)
    tokens = sum(r["data"]["completion_tokens"] for r in made)
    sink.event("generated", f"{len(made)} choice(s), {tokens} tokens", data={"completion_tokens": tokens})


def _answer_with_tools(
    spec: GenerateSpec, sink: Sink, model: HFChat, sandbox: SandboxLimits | None
) -> list[dict[str, Any]]:
    """One call's choices as tool rollouts (evaluator/tool_rollouts.py, the loop eval jobs run) on the
    model on transformers (`Chat.here`; the `hf` backend's generate): a chat gets the format's instruction
    as its system text; each row keeps its turns (`tool_turns`)."""
    from evaluator.python_tool import job_tool
    from evaluator.tool_formats import tool_format
    from evaluator.tool_rollouts import generate_with_tools
    from mathrl.errors import FieldError

    assert spec.tools is not None  # (its caller's test)
    fmt, python = tool_format(spec.tools.format, model.tokenizer), spec.tools.python
    messages = [m.model_dump() for m in spec.messages] if spec.messages is not None else None
    if messages is None and fmt.chat_tools:
        raise FieldError("tools/format", "format 'chat-template' renders a chat: give messages, not a prompt")
    if messages is not None:  # the format's instruction, after the chat's own system text
        if messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{fmt.instruction}"}
        else:
            messages.insert(0, {"role": "system", "content": fmt.instruction})
    with model.lock:
        prompt = model.prompt(messages, spec.prompt, fmt.chat_tools)
        with job_tool(python.timeout_s, python.max_output_chars, sandbox) as tool:
            seed = spec.seed if spec.seed is not None else secrets.randbits(31)
            decoding = Decoding(
                spec.max_tokens, tuple(spec.stop or ()), spec.temperature, spec.top_p, spec.n, seed, batch_size=spec.n
            )
            gens, _ = generate_with_tools(
                backend("hf").generator(model.model, model.tokenizer), [prompt], decoding, tool=tool, fmt=fmt,
                max_calls=python.max_calls, should_stop=sink.should_stop,
            )  # fmt: skip
        choices = [Choice(g.text, "length" if g.truncated else "stop", g.tokens) for g in gens[0]]
        made = rows(prompt, model.prompt_tokens(prompt), 0, choices)
    for row, g in zip(made, gens[0], strict=True):
        row["data"]["tool_turns"] = g.tool_turns
    return made


def _knobs(call: Any) -> tuple[Any, ...] | None:
    """What lines generated together must share (None: a line that did not parse, alone)."""
    if isinstance(call, Exception) or call.function_tools:
        return None  # (a call with functions is answered alone: its calls are read from its text)
    schema = json.dumps(answer_schema(call), sort_keys=True)
    return (
        call.max_tokens,
        call.temperature,
        call.top_p,
        call.n,
        tuple(call.stop or ()),
        call.seed,
        call.logprobs,
        schema,
    )


_Unit = list[tuple[int, dict[str, Any], Any]]  # a batch's lines answered together: (number, line, call or error)
# a batch's lines sent to a warm engine at once (its continuous batching runs them together), or
# generated as one batch on transformers
BATCH_IN_FLIGHT = 16


def run_batch(
    spec: GenerateSpec,
    sink: Sink,
    model_path: str,
    warm: WarmEngineAddress | None = None,
    in_flight: int = BATCH_IN_FLIGHT,
) -> None:
    """A batch (OpenAI's Batch API): each line of its file answered as a call of its own, its
    choices stored as the samples of step <line>, with the line's custom_id. On a warm engine,
    `in_flight` lines at once (the engine batches them); on transformers, up to `in_flight` lines in
    a row with the same knobs generated as one batch (`Chat.calls`). A line
    that cannot be answered (a prompt past the model's context, say) is stored as its error and the
    batch goes on, as OpenAI's error file has it; the API writes the output and error files from
    the samples once the job ends (api/openai/batch_views.py `finish`). A stop keeps what was answered,
    and a resumed batch (after a drain or a pause) goes on after the lines stored."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    from mathrl.specs.generate import CHAT_ENDPOINT, GenerateSpec, sampling_fields
    from runtime.errors import StopRequested

    assert spec.batch is not None and spec.batch._path is not None  # a batch job, its file found (worker.child)
    is_chat = spec.batch.endpoint == CHAT_ENDPOINT
    with open(spec.batch._path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    chat = chat_for(spec.backend, model_path, spec.dtype, warm)
    chat.prepare()  # a model that cannot load fails the batch, not each line
    base = spec.model_dump(mode="json", exclude={"batch", "messages", "prompt"})
    stored = sink.stored_steps()  # an earlier attempt's lines (a drain, a pause): not answered twice
    todo = [(n, line) for n, line in enumerate(lines) if n not in stored]

    def call_of(line: dict[str, Any]) -> Any:
        fields = {k: v for k, v in sampling_fields(line["body"], is_chat).items() if v is not None}
        return GenerateSpec.model_validate({**base, **fields, "stream": False})

    def failure(line: dict[str, Any], exc: Exception) -> list[dict[str, Any]]:
        error = {"code": type(exc).__name__, "message": str(exc)[:2000] or type(exc).__name__}
        return [{"prompt": "", "completion": "", "data": {"custom_id": line["custom_id"], "index": 0, "error": error}}]

    def tagged(line: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**r, "data": {**r["data"], "custom_id": line["custom_id"]}} for r in rows]

    def answer(unit: _Unit) -> list[tuple[int, list[dict[str, Any]]]]:
        """A unit's lines' rows: their choices, or each one's error (the batch goes on). Several
        lines (same knobs, on transformers) are generated together; should that fail, each alone."""
        out = [(n, failure(line, call)) for n, line, call in unit if isinstance(call, Exception)]
        calls = [(n, line, call) for n, line, call in unit if not isinstance(call, Exception)]
        if len(calls) > 1:
            try:
                many = chat.calls([c for _, _, c in calls], sink)
                return out + [(n, tagged(line, rows)) for (n, line, _), rows in zip(calls, many, strict=True)]
            except StopRequested:
                raise
            except Exception:
                log.warning("%d lines generated together failed; answering each alone", len(calls), exc_info=True)
        for n, line, call in calls:
            try:
                out.append((n, tagged(line, chat.call(call, sink, NoDeltas()))))
            except StopRequested:
                raise
            except Exception as exc:
                out.append((n, failure(line, exc)))
        return out

    def units() -> Iterator[_Unit]:
        """On an engine that batches what it is sent (`Chat.together` false) a line a unit (`in_flight`
        of them sent at once); else up to `in_flight` lines in a row with the same knobs, generated as one
        batch."""
        unit: _Unit = []
        for n, line in todo:
            try:
                call: Any = call_of(line)
            except Exception as exc:
                call = exc
            if unit and (not chat.together or len(unit) >= in_flight or _knobs(unit[-1][2]) != _knobs(call)):
                yield unit
                unit = []
            unit.append((n, line, call))
        if unit:
            yield unit

    answered = failed = tokens = done = 0

    def record(n: int, rows: list[dict[str, Any]]) -> None:
        nonlocal answered, failed, tokens, done
        sink.samples(n, rows)
        if "error" in rows[0]["data"]:
            failed += 1
        else:
            answered += 1
            tokens += sum(r["data"]["completion_tokens"] for r in rows)
        done += 1
        sink.progress(len(stored) + done, len(lines), "answering")

    width = 1 if chat.together else max(1, in_flight)
    with ThreadPoolExecutor(width, thread_name_prefix="mathrl-batch") as pool:
        pending: set[Future[list[tuple[int, list[dict[str, Any]]]]]] = set()
        queue = units()
        try:
            while True:
                while len(pending) < width and (unit := next(queue, None)) is not None:
                    if sink.should_stop():
                        raise StopRequested("stop requested")
                    pending.add(pool.submit(answer, unit))
                if not pending:
                    break
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    pending.discard(fut)
                    for n, rows in fut.result():
                        record(n, rows)
        finally:
            for fut in pending:  # a stop, or a line's own failure: the lines sent finish, no new one starts
                fut.cancel()
    message = f"{answered} of {len(todo)} requests answered ({failed} failed), {tokens} tokens"
    message += f"; {len(stored)} answered before" if stored else ""
    sink.event("generated", message, data={"completion_tokens": tokens, "answered": answered, "failed": failed})


Answer = Callable[[Sequence[list[dict[str, str]]], Mapping[str, Any]], list[str]]


def judges(
    resolve: Callable[[str], str] | None = None,
    cache: dict[str, Chat] | None = None,
    warm: WarmEngineAddress | None = None,
) -> Callable[[str], Answer]:
    """What score_model and label_model graders ask (evaluator/graders.py `Batch.judge`): model
    ref -> answer(chats, sampling_params), each model's backend `Chat.judge`. Each model is held
    once in `cache` (`resolve`: ref -> local path); with `warm`, the worker's warm vLLM engine
    serving the job's one grading model answers instead (worker/warm_engine.py engine_model).
    OpenAI's sampling_params: temperature (default 0 here: greedy), top_p, max_completions_tokens
    (default 256) and seed."""
    held: dict[str, Chat] = {} if cache is None else cache

    def judge(ref: str) -> Answer:
        if ref not in held:
            held[ref] = chat_for("auto", _resolved(ref, resolve), warm=warm)
        return held[ref].judge

    return judge


def _resolved(ref: str, resolve: Callable[[str], str] | None) -> ModelPath:
    """A grading model's path, found only where it loads in this process (a warm engine answers without)."""
    return ref if resolve is None else lambda: resolve(ref)
