"""Answering chats and prompts with a model: the 'generate' job behind the OpenAI-compatible
POST /v1/chat/completions and /v1/completions (api/routers/openai_inference.py), and the
grading models of score_model and label_model graders (`judges`).

A generate job runs on the worker's warm vLLM engine when it asks for `backend: vllm` (the
supervisor hands it one, worker/warm_engine.py: the request goes to that server's own
/v1/chat/completions or /v1/completions), else on transformers in the job's process. With
`stream`, the text is stored as 'delta' events while it is generated (at most every
DELTA_SECONDS), which the API relays as server-sent events; the choices themselves are the job's
samples: text, finish_reason and token counts."""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from evaluator.backends.base import WarmEngineAddress
from evaluator.logprobs import Token, content_tokens, from_completion_chunk, kept_tokens, token_logprobs

if TYPE_CHECKING:
    from evaluator.backends.vllm import RemoteEngine
    from mathrl.specs import GenerateSpec

DELTA_SECONDS = 0.2  # the longest a streamed delta waits to be stored

log = logging.getLogger(__name__)


@dataclass
class Choice:
    text: str
    finish_reason: str  # 'stop' or 'length'
    completion_tokens: int
    logprobs: list[Token] | None = None  # asked for: each token's (evaluator/logprobs.py)


class ChatModel:
    """A causal LM and its tokenizer, loaded once, answering chats or plain prompts."""

    def __init__(self, path: str, dtype: str = "auto"):
        from evaluator.models import load_model, load_tokenizer

        self.tokenizer = load_tokenizer(path)
        self.model = load_model(path, dtype)

    def prompt(
        self, messages: Sequence[Mapping[str, Any]] | None, text: str | None = None, tools: list[Any] | None = None
    ) -> str:
        """The text the model continues: the chat through its chat template (with `tools`, the schemas it
        renders), or `text` as it is."""
        if messages is None:
            return text or ""
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]  # (a tool message's fields too)
        extra = {"tools": tools} if tools else {}
        return str(self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, **extra))

    def prompt_tokens(self, prompt: str) -> int:
        return len(self.tokenizer(prompt, add_special_tokens=False).input_ids)

    def answer(
        self,
        prompts: list[str],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        n: int = 1,
        stop: list[str] | None = None,
        seed: int = 0,
        should_stop: Callable[[], bool] | None = None,
        logprobs: int | None = None,
        schema: dict[str, Any] | None = None,
    ) -> list[list[Choice]]:
        """Each prompt's `n` choices; with `logprobs`, each one's tokens' and that many most likely
        alternatives' log-probabilities; with `schema`, each a JSON text it admits (evaluator/structured.py)."""
        from evaluator.backends.hf import eos_ids, generate

        out = generate(
            self.model,
            self.tokenizer,
            prompts,
            max_new_tokens=max_tokens,
            stop=stop,
            temperature=temperature,
            top_p=top_p,
            n=n,
            seed=seed,
            should_stop=should_stop,
            constrain=self.constraint(schema),
        )
        choices = [[Choice(g.text, "length" if g.truncated else "stop", g.tokens) for g in gens] for gens in out]
        if logprobs is not None:
            stops = eos_ids(self.model, self.tokenizer)
            for prompt, gens, made in zip(prompts, out, choices, strict=True):
                for g, c in zip(gens, made, strict=True):
                    c.logprobs = self.logprobs(prompt, kept_tokens(self.tokenizer, g.ids, stops, g.text), logprobs)
        return choices

    def constraint(self, schema: dict[str, Any] | None) -> Callable[[], Any] | None:
        """What holds an answer to `schema` (None: nothing)."""
        if schema is None:
            return None
        from evaluator.backends.hf import eos_ids
        from evaluator.structured import constraint

        return constraint(self.model, self.tokenizer, schema, eos_ids(self.model, self.tokenizer))

    def logprobs(self, prompt: str, ids: list[int], top: int) -> list[Token]:
        """The log-probabilities of a completion's tokens `ids` after `prompt` (evaluator/logprobs.py)."""
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False).input_ids
        return token_logprobs(self.model, self.tokenizer, prompt_ids, ids, top)

    def stream(
        self,
        prompt: str,
        on_text: Callable[[str], None],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        stop: list[str] | None = None,
        seed: int = 0,
        logprobs: int | None = None,
        schema: dict[str, Any] | None = None,
    ) -> Choice:
        """One completion, its text passed to `on_text` piece by piece while it is generated
        (never past a stop string, which is cut as `answer` cuts it); its log-probabilities, asked
        for, once it is whole."""
        import torch
        from transformers import TextIteratorStreamer

        from evaluator.backends.hf import cut_at_stop, eos_ids

        enc = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(self.model.device)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": eos_ids(self.model, self.tokenizer),
            "streamer": streamer,
        }
        if stop:
            kwargs.update(stop_strings=list(stop), tokenizer=self.tokenizer)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if (constrain := self.constraint(schema)) is not None:
            kwargs["logits_processor"] = [constrain()]
        result: dict[str, Any] = {}

        def run() -> None:
            torch.manual_seed(seed)
            try:
                with torch.inference_mode():
                    result["ids"] = self.model.generate(**enc, **kwargs)
            except BaseException as exc:  # re-raised below, after the streamer is drained
                result["error"] = exc
                streamer.end()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        text, sent = "", 0
        hold = max((len(s) for s in stop or []), default=0)  # what may still turn out to start a stop string
        for piece in streamer:
            text += piece
            cut, stopped = cut_at_stop(text, stop)
            safe = len(cut) if stopped else max(sent, len(cut) - hold)
            if safe > sent:
                on_text(cut[sent:safe])
                sent = safe
        thread.join()
        if "error" in result:
            raise result["error"]
        cut, stopped = cut_at_stop(text, stop)
        if len(cut) > sent:
            on_text(cut[sent:])
        new = result["ids"][0, enc["input_ids"].shape[1] :].tolist()
        stops = eos_ids(self.model, self.tokenizer)
        ended = next((j for j, t in enumerate(new) if t in stops), None)
        tokens = ended + 1 if ended is not None else len(new)
        choice = Choice(cut, "stop" if stopped or ended is not None else "length", tokens)
        if logprobs is not None:
            choice.logprobs = self.logprobs(prompt, kept_tokens(self.tokenizer, new, stops, cut), logprobs)
        return choice


class DeltaWriter:
    """Streamed text stored as 'delta' events, each holding what came in at most DELTA_SECONDS."""

    def __init__(self, sink: Any):
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
    spec: GenerateSpec, sink: Any, model_path: str, warm: WarmEngineAddress | None = None, sandbox: Any = None
) -> None:
    """A generate job: its choices as samples (and 'delta' events while streaming); on `warm`, the
    worker's warm engine it was given, else on transformers in this process. A batch: `run_batch`.
    With `tools`, rollouts on transformers, their calls in the job's tool sandbox (`sandbox`: the
    operator's graders settings)."""
    if spec.batch is not None:
        run_batch(spec, sink, model_path, warm)
        return
    models = _Loaded(model_path, spec.dtype)
    deltas = DeltaWriter(sink)
    if spec.tools is not None:
        rows = _answer_with_tools(spec, sink, models(), sandbox)
    else:
        rows = _answer(spec, sink, models, warm, deltas)
    deltas.flush()
    sink.samples(0, rows)
    tokens = sum(r["data"]["completion_tokens"] for r in rows)
    sink.event("generated", f"{len(rows)} choice(s), {tokens} tokens", data={"completion_tokens": tokens})


class _Loaded:
    """The job's model on transformers, loaded at its first use (a call a warm engine answers needs
    none); `lock`: one call at a time on it (a batch's lines past the warm engine's context, from
    its threads)."""

    def __init__(self, path: str, dtype: str):
        self.path, self.dtype = path, dtype
        self.model: ChatModel | None = None
        self.lock = threading.Lock()

    def __call__(self) -> ChatModel:
        if self.model is None:
            self.model = ChatModel(self.path, self.dtype)
        return self.model


def _answer(
    spec: GenerateSpec, sink: Any, models: _Loaded, warm: WarmEngineAddress | None, deltas: Any
) -> list[dict[str, Any]]:
    """One call's choices as sample rows: on the warm engine where the call fits it, else on transformers."""
    engine = _warm_engine_that_holds(spec, sink, warm) if warm is not None and not spec.function_tools else None
    if engine is None:
        with models.lock:
            return _answer_here(spec, sink, models(), deltas)
    # cached: the prompt's tokens found in the engine's prefix cache (its project's own: cache_salt)
    prompt_tokens, cached_tokens, choices = _generate_remote(spec, engine, deltas)
    prompt = (spec.prompt or "") if spec.messages is None else json.dumps([m.model_dump() for m in spec.messages])
    return _rows(prompt, prompt_tokens, cached_tokens, choices)


def _answer_here(spec: GenerateSpec, sink: Any, model: ChatModel, deltas: Any) -> list[dict[str, Any]]:
    """One call's choices on transformers, in this process; with functions, each choice's calls read out
    of its text (evaluator/function_calls.py)."""
    from evaluator.function_calls import check_template, read_calls

    functions = [t.model_dump(exclude_none=True) for t in spec.function_tools or []]
    if functions:
        check_template(model.tokenizer)
    prompt = model.prompt(_template_messages(spec), spec.prompt, functions or None)
    options: dict[str, Any] = {
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "stop": spec.stop,
        # no seed: a draw of its own, as OpenAI's repeated calls differ (0 made every call's answer the same)
        "seed": spec.seed if spec.seed is not None else secrets.randbits(31),
        "logprobs": spec.logprobs,
        "schema": _schema(spec),
    }
    if spec.stream and spec.n == 1:
        choices = [model.stream(prompt, lambda text: deltas.add(0, text), **options)]
    else:
        choices = model.answer([prompt], n=spec.n, should_stop=sink.should_stop, **options)[0]
        if spec.stream:  # several choices: each one's text comes whole, when all are done
            for i, c in enumerate(choices):
                deltas.add(i, c.text)
    rows = _rows(prompt, model.prompt_tokens(prompt), 0, choices)
    for row in rows if functions and spec.tool_choice != "none" else []:
        row["completion"], calls = read_calls(model.tokenizer, row["completion"], functions)
        if calls:
            row["data"].update(tool_calls=calls, finish_reason="tool_calls")
    return rows


def _template_messages(spec: GenerateSpec) -> list[dict[str, Any]] | None:
    """The chat as the model's template reads it: calls' arguments as objects, tool messages named."""
    if spec.messages is None:
        return None
    names = {c.id: c.function.name for m in spec.messages for c in m.tool_calls or []}
    return [m.for_template(names) for m in spec.messages]


def _answer_with_tools(spec: GenerateSpec, sink: Any, model: ChatModel, sandbox: Any) -> list[dict[str, Any]]:
    """One call's choices as tool rollouts (evaluator/tool_rollouts.py, the loop eval jobs run): a chat
    gets the format's instruction as its system text; each row keeps its turns (`tool_turns`)."""
    from evaluator.backends import backend
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
    prompt = model.prompt(messages, spec.prompt, fmt.chat_tools)
    with job_tool(python.timeout_s, python.max_output_chars, sandbox) as tool:
        gens, _ = generate_with_tools(
            backend("hf"), model.model, model.tokenizer, [prompt], tool=tool, fmt=fmt, max_calls=python.max_calls,
            max_new_tokens=spec.max_tokens, stop=list(spec.stop or []), temperature=spec.temperature, top_p=spec.top_p,
            n=spec.n, seed=spec.seed if spec.seed is not None else secrets.randbits(31), batch_size=spec.n,
            should_stop=sink.should_stop,
        )  # fmt: skip
    choices = [Choice(g.text, "length" if g.truncated else "stop", g.tokens) for g in gens[0]]
    rows = _rows(prompt, model.prompt_tokens(prompt), 0, choices)
    for row, g in zip(rows, gens[0], strict=True):
        row["data"]["tool_turns"] = g.tool_turns
    return rows


def _schema(spec: GenerateSpec) -> dict[str, Any] | None:
    """The JSON Schema a call's answer is held to (its response_format), None for plain text."""
    held = spec.response_format
    return held.target() if held is not None and held.constrains() else None


def _rows(prompt: str, prompt_tokens: int, cached_tokens: int, choices: list[Choice]) -> list[dict[str, Any]]:
    """A call's choices as its sample rows."""
    return [
        {
            "prompt": prompt,
            "completion": c.text,
            "data": {
                "index": i,
                "finish_reason": c.finish_reason,
                "prompt_tokens": prompt_tokens,
                "cached_tokens": cached_tokens,
                "completion_tokens": c.completion_tokens,
                **({"logprobs": c.logprobs} if c.logprobs is not None else {}),
            },
        }
        for i, c in enumerate(choices)
    ]


def _knobs(call: Any) -> tuple[Any, ...] | None:
    """What lines generated together must share (None: a line that did not parse, alone)."""
    if isinstance(call, Exception) or call.function_tools:
        return None  # (a call with functions is answered alone: its calls are read from its text)
    schema = json.dumps(_schema(call), sort_keys=True)
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


def _answer_many(calls: list[Any], sink: Any, model: ChatModel) -> list[list[dict[str, Any]]]:
    """Calls with the same knobs (`_knobs`), generated as one batch on transformers: each one's rows."""
    first = calls[0]
    prompts = [model.prompt(_template_messages(c), c.prompt) for c in calls]
    choices = model.answer(
        prompts,
        max_tokens=first.max_tokens,
        temperature=first.temperature,
        top_p=first.top_p,
        n=first.n,
        stop=first.stop,
        seed=first.seed if first.seed is not None else secrets.randbits(31),
        should_stop=sink.should_stop,
        logprobs=first.logprobs,
        schema=_schema(first),
    )
    return [_rows(p, model.prompt_tokens(p), 0, c) for p, c in zip(prompts, choices, strict=True)]


class _NoDeltas:
    """A batch's calls are not streamed: their text is stored whole."""

    def add(self, index: int, text: str) -> None:
        pass


_Unit = list[tuple[int, dict[str, Any], Any]]  # a batch's lines answered together: (number, line, call or error)
# a batch's lines sent to a warm engine at once (its continuous batching runs them together), or
# generated as one batch on transformers
BATCH_IN_FLIGHT = 16


def run_batch(
    spec: GenerateSpec,
    sink: Any,
    model_path: str,
    warm: WarmEngineAddress | None = None,
    in_flight: int = BATCH_IN_FLIGHT,
) -> None:
    """A batch (OpenAI's Batch API): each line of its file answered as a call of its own, its
    choices stored as the samples of step <line>, with the line's custom_id. On a warm engine,
    `in_flight` lines at once (the engine batches them); on transformers, up to `in_flight` lines in
    a row with the same knobs generated as one batch (`_answer_many`). A line
    that cannot be answered (a prompt past the model's context, say) is stored as its error and the
    batch goes on, as OpenAI's error file has it; the API writes the output and error files from
    the samples once the job ends (api/routers/openai_batches.py). A stop keeps what was answered,
    and a resumed batch (after a drain or a pause) goes on after the lines stored."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    from mathrl.specs.generate import CHAT_ENDPOINT, GenerateSpec, sampling_fields
    from runtime.errors import StopRequested

    assert spec.batch is not None and spec.batch._path is not None  # a batch job, its file found (worker.child)
    chat = spec.batch.endpoint == CHAT_ENDPOINT
    with open(spec.batch._path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    models = _Loaded(model_path, spec.dtype)
    if warm is None:
        models()  # a model that cannot load fails the batch, not each line
    base = spec.model_dump(mode="json", exclude={"batch", "messages", "prompt"})
    stored = sink.stored_steps()  # an earlier attempt's lines (a drain, a pause): not answered twice
    todo = [(n, line) for n, line in enumerate(lines) if n not in stored]

    def call_of(line: dict[str, Any]) -> Any:
        fields = {k: v for k, v in sampling_fields(line["body"], chat).items() if v is not None}
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
                with models.lock:
                    many = _answer_many([c for _, _, c in calls], sink, models())
                return out + [(n, tagged(line, rows)) for (n, line, _), rows in zip(calls, many, strict=True)]
            except StopRequested:
                raise
            except Exception:
                log.warning("%d lines generated together failed; answering each alone", len(calls), exc_info=True)
        for n, line, call in calls:
            try:
                out.append((n, tagged(line, _answer(call, sink, models, warm, _NoDeltas()))))
            except StopRequested:
                raise
            except Exception as exc:
                out.append((n, failure(line, exc)))
        return out

    def units() -> Iterator[_Unit]:
        """On a warm engine a line a unit (`in_flight` of them sent at once); on transformers up to
        `in_flight` lines in a row with the same knobs, generated as one batch."""
        unit: _Unit = []
        for n, line in todo:
            try:
                call: Any = call_of(line)
            except Exception as exc:
                call = exc
            if unit and (warm is not None or len(unit) >= in_flight or _knobs(unit[-1][2]) != _knobs(call)):
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

    width = max(1, in_flight) if warm is not None else 1
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


def _warm_engine_that_holds(spec: GenerateSpec, sink: Any, warm: WarmEngineAddress) -> RemoteEngine | None:
    """The warm engine, where the call's prompt and max_tokens fit its context
    (worker.warm_engine_max_model_len, 4096 by default, not the model's own); None: answer with
    transformers, as an eval that needs more loads an engine of its own. Before, the engine refused
    such a call (vLLM's 400) and the client got a 502 where OpenAI answers."""
    import httpx

    from evaluator.backends.vllm import connect

    engine = connect(warm, sink.should_stop)
    body: dict[str, Any] = {"model": engine.model}
    if spec.messages is not None:
        body["messages"] = [m.model_dump(exclude_none=True) for m in spec.messages]
    else:
        body["prompt"] = spec.prompt
    r = httpx.post(engine.url + "/tokenize", json=body, timeout=60)  # vLLM's own count, its chat template's
    r.raise_for_status()
    needed = int(r.json()["count"]) + int(spec.max_tokens)
    if needed <= engine.max_model_len:
        return engine
    sink.event(
        "loading",
        f"this call needs {needed} tokens (its prompt and max_tokens), more than the warm engine's "
        f"{engine.max_model_len} (worker.warm_engine_max_model_len): answering with transformers",
    )
    return None


def _generate_remote(spec: GenerateSpec, engine: RemoteEngine, deltas: DeltaWriter) -> tuple[int, int, list[Choice]]:
    """The request sent to the warm engine's own OpenAI server, streamed, its deltas stored; the
    prompt's tokens, those of them its prefix cache held, and the choices."""
    import httpx

    body: dict[str, Any] = engine.salted({
        "model": engine.model,
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "n": spec.n,
        "stop": spec.stop,
        "seed": spec.seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    })  # fmt: skip
    if spec.response_format is not None and spec.response_format.constrains():  # the engine's guided decoding
        body["response_format"] = spec.response_format.model_dump(mode="json", exclude_none=True)
    chat = spec.messages is not None
    if spec.messages is not None:
        path, body["messages"] = "/v1/chat/completions", [m.model_dump(exclude_none=True) for m in spec.messages]
    else:
        path, body["prompt"] = "/v1/completions", spec.prompt
    if spec.logprobs is not None:  # the engine's own (raw: its default logprobs-mode)
        body.update({"logprobs": True, "top_logprobs": spec.logprobs} if chat else {"logprobs": spec.logprobs})
    logprobs: dict[int, list[Token]] = {}
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    usage: dict[str, Any] = {}
    with httpx.stream("POST", engine.url + path, json=body, timeout=None) as r:
        if r.status_code != 200:
            raise RuntimeError(f"the vLLM engine refused the request ({r.status_code}): {r.read()[:500]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for c in chunk.get("choices") or []:
                piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
                if piece:
                    texts[c["index"]] = texts.get(c["index"], "") + piece
                    deltas.add(c["index"], piece)
                if c.get("finish_reason"):
                    reasons[c["index"]] = c["finish_reason"]
                if c.get("logprobs"):
                    got = c["logprobs"].get("content") or [] if chat else from_completion_chunk(c["logprobs"])
                    logprobs.setdefault(c["index"], []).extend(got)
    per_choice = usage.get("completion_tokens", 0) // max(spec.n, 1)
    asked = spec.logprobs is not None
    choices = [
        Choice(
            texts.get(i, ""),
            reasons.get(i, "stop"),
            per_choice,
            content_tokens(logprobs.get(i, []), texts.get(i, "")) if asked else None,
        )  # fmt: skip
        for i in range(spec.n)
    ]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return int(usage.get("prompt_tokens", 0)), int(cached), choices


JUDGE_DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "max_completions_tokens": 256, "seed": 0}


Answer = Callable[[Sequence[list[dict[str, str]]], Mapping[str, Any]], list[str]]


def judges(
    resolve: Callable[[str], str] | None = None,
    cache: dict[str, ChatModel] | None = None,
    warm: WarmEngineAddress | None = None,
) -> Callable[[str], Answer]:
    """What score_model and label_model graders ask (evaluator/graders.py `Batch.judge`): model
    ref -> answer(chats, sampling_params). Each model is loaded once into `cache` (`resolve`:
    ref -> local path); with `warm`, the worker's warm vLLM engine serving the job's one
    grading model answers instead (worker/warm_engine.py engine_model). OpenAI's
    sampling_params: temperature (default 0 here: greedy), top_p, max_completions_tokens
    (default 256) and seed."""
    loaded: dict[str, ChatModel] = {} if cache is None else cache

    def judge(ref: str) -> Answer:
        if warm is not None:
            return lambda chats, params: _answer_remote(warm, chats, {**JUDGE_DEFAULTS, **_given(params)})
        if ref not in loaded:
            loaded[ref] = ChatModel(resolve(ref) if resolve else ref)
        model = loaded[ref]

        def answer(chats: Sequence[list[dict[str, str]]], params: Mapping[str, Any]) -> list[str]:
            p = {**JUDGE_DEFAULTS, **_given(params)}
            prompts = [model.prompt(chat) for chat in chats]
            out = model.answer(
                prompts,
                max_tokens=int(p["max_completions_tokens"]),
                temperature=float(p["temperature"]),
                top_p=float(p["top_p"]),
                seed=int(p["seed"]),
            )
            return [gens[0].text for gens in out]

        return answer

    return judge


def _given(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None and k in JUDGE_DEFAULTS}


def _answer_remote(warm: WarmEngineAddress, chats: Sequence[list[dict[str, str]]], p: Mapping[str, Any]) -> list[str]:
    """The chats sent to the warm engine's own /v1/chat/completions at once (its scheduler batches
    them), with the sampling parameters transformers would use."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from evaluator.backends.vllm import connect

    engine = connect(warm)
    body = engine.salted({
        "model": engine.model,
        "max_tokens": int(p["max_completions_tokens"]),
        "temperature": float(p["temperature"]),
        "top_p": float(p["top_p"]),
        "seed": int(p["seed"]),
    })  # fmt: skip
    with httpx.Client(base_url=engine.url, timeout=None) as http:

        def one(chat: list[dict[str, str]]) -> str:
            r = http.post("/v1/chat/completions", json={**body, "messages": chat})
            if r.status_code != 200:
                raise RuntimeError(f"the vLLM engine refused a grading request ({r.status_code}): {r.text[:500]}")
            return str(r.json()["choices"][0]["message"]["content"] or "")

        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(one, chats))
