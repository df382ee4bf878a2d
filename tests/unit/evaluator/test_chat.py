"""A generate job's sampling on transformers (evaluator/chat.py), as chat.completions runs it."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from evaluator.chat import run_generate
from mathrl.specs import parse_spec

pytestmark = pytest.mark.quick


class Recorded:
    """What a job process's sink keeps of a generate job: its samples and events."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.rows += rows

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        self.events.append((kind, message))

    def should_stop(self) -> bool:
        return False

    def progress(self, done: int, total: int, message: str = "") -> None:
        self.events.append(("progress", f"{done}/{total}"))

    def stored_steps(self) -> set[int]:
        return set(self.steps)

    steps: tuple[int, ...] = ()  # what an earlier attempt stored


def _answers(model: str, **over: Any) -> list[str]:
    spec = parse_spec(
        {"kind": "generate", "model": model, "prompt": "1 + 1 =", "temperature": 1.0, "max_tokens": 12, **over}
    )
    sink = Recorded()
    run_generate(spec, sink, model)
    return [r["completion"] for r in sink.rows]


def test_calls_without_a_seed_differ_and_with_one_repeat(tiny_model: str) -> None:
    """OpenAI's repeated calls differ unless they send a seed; a missing seed was 0, so every
    sampled call (a pass@k script's k calls) got the same answer."""
    seeded = [_answers(tiny_model, seed=3) for _ in range(2)]
    assert seeded[0] == seeded[1]
    unseeded = {tuple(_answers(tiny_model)) for _ in range(3)}
    assert len(unseeded) > 1, unseeded


class _Engine(BaseHTTPRequestHandler):
    """A stand-in for a warm vLLM engine's OpenAI server (the routes the job process calls), with a
    64-token context: the real one runs in tests/system/test_vllm.py."""

    calls: list[str] = []
    bodies: list[dict[str, Any]] = []
    logprobs: dict[str, Any] | None = None  # what the first chunk's choice carries
    answer_seconds = 0.0  # how long an answer takes
    active = busiest = 0  # answers under way now, and at most
    guard = threading.Lock()

    def _json(self, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.calls.append(self.path)
        self._json({"data": [{"id": "m", "max_model_len": 64}]} if self.path == "/v1/models" else {})

    def do_POST(self) -> None:
        self.calls.append(self.path)
        self.bodies.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}"))
        if self.path == "/tokenize":
            return self._json({"count": 10, "max_model_len": 64, "tokens": list(range(10))})
        with _Engine.guard:
            _Engine.active += 1
            _Engine.busiest = max(_Engine.busiest, _Engine.active)
        time.sleep(self.answer_seconds)
        with _Engine.guard:
            _Engine.active -= 1
        chunks = [
            {"choices": [{"index": 0, "text": "2", "finish_reason": None, "logprobs": self.logprobs}]},
            {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1}},
        ]
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_call_past_the_warm_engines_context_is_answered_with_transformers(tiny_model: str) -> None:
    """The warm engine's context is the operator's cap (worker.warm_engine_max_model_len, 4096), not the
    model's: a chat whose prompt and max_tokens exceeded it was refused by vLLM, and the client got a 502."""
    from evaluator.backends.base import WarmEngineAddress

    _Engine.calls, _Engine.bodies = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    warm = WarmEngineAddress(f"http://127.0.0.1:{server.server_port}", None, 10.0, cache_salt="project-salt")
    try:
        # (the worker gives a job a warm engine where its backend is 'auto' or 'vllm': kinds/generate.py needs)
        spec = parse_spec(
            {"kind": "generate", "model": tiny_model, "prompt": "1 + 1 =", "max_tokens": 8, "backend": "auto"}
        )
        fits = Recorded()
        run_generate(spec, fits, tiny_model, warm)
        assert [r["completion"] for r in fits.rows] == ["2"] and "/v1/completions" in _Engine.calls
        # the project's prefix-cache salt (worker.warm_engine.cache_salt; the real engine's cache in
        # tests/system/test_vllm.py)
        assert _Engine.bodies[-1]["cache_salt"] == "project-salt"
        _Engine.calls = []
        spec = parse_spec(
            {"kind": "generate", "model": tiny_model, "prompt": "1 + 1 =", "max_tokens": 60, "backend": "auto"}
        )
        past = Recorded()
        run_generate(spec, past, tiny_model, warm)
    finally:
        server.shutdown()
    assert "/v1/completions" not in _Engine.calls, _Engine.calls
    assert any(k == "loading" and "70 tokens" in m and "transformers" in m for k, m in past.events), past.events
    assert len(past.rows) == 1 and past.rows[0]["data"]["completion_tokens"] > 0


def _generated(model: str, **over: Any) -> list[dict[str, Any]]:
    spec = parse_spec({"kind": "generate", "model": model, "prompt": "1 + 1 =", "max_tokens": 10, "seed": 5, **over})
    sink = Recorded()
    run_generate(spec, sink, model)
    return sink.rows


def test_logprobs_are_the_models_for_the_tokens_it_kept(tiny_model: str) -> None:
    """Each kept token's log-probability under the model (one teacher-forced pass), the `top` most
    likely in its place: greedy text picks the most likely token at every place; sampled text
    never one likelier than the most likely; streamed, the same as answered whole; a stop string's
    cut keeps the tokens that make up the text. (The tiny model's tokenizer is character-level: the
    tokens but the special ones, which the text leaves out, join to the text.)"""
    import math

    from transformers import AutoTokenizer

    special = set(AutoTokenizer.from_pretrained(tiny_model).all_special_tokens)

    def joined(tokens: list[dict[str, Any]]) -> str:
        return "".join(t["token"] for t in tokens if t["token"] not in special)

    greedy = _generated(tiny_model, temperature=0, logprobs=3)[0]
    tokens = greedy["data"]["logprobs"]
    assert joined(tokens) == greedy["completion"] and tokens, greedy
    for t in tokens:
        tops = [a["logprob"] for a in t["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and t["logprob"] <= 0
        assert t["top_logprobs"][0]["token"] == t["token"] and math.isclose(t["logprob"], tops[0], abs_tol=1e-5)
        assert t["bytes"] == list(t["token"].encode())
    streamed = _generated(tiny_model, temperature=0, logprobs=3, stream=True)[0]
    assert streamed["completion"] == greedy["completion"]
    assert [round(t["logprob"], 4) for t in streamed["data"]["logprobs"]] == [round(t["logprob"], 4) for t in tokens]
    sampled = _generated(tiny_model, temperature=1.0, n=3, logprobs=1)
    assert len(sampled) == 3
    for row in sampled:
        got = row["data"]["logprobs"]
        assert joined(got) == row["completion"]
        assert all(t["logprob"] <= t["top_logprobs"][0]["logprob"] + 1e-5 for t in got)
    cut = greedy["completion"][2:4]  # a stop string inside the greedy text: the text ends before it
    stopped = _generated(tiny_model, temperature=0, logprobs=0, stop=[cut])[0]
    assert stopped["completion"] == greedy["completion"][: greedy["completion"].index(cut)]
    kept = joined(stopped["data"]["logprobs"])
    assert kept.startswith(stopped["completion"]) and len(kept) <= len(stopped["completion"]) + 1
    assert all(t["top_logprobs"] == [] for t in stopped["data"]["logprobs"])
    assert "logprobs" not in _generated(tiny_model, temperature=0)[0]["data"]  # none asked for: none stored


def test_a_warm_engines_logprobs_are_kept_per_choice(tiny_model: str) -> None:
    """A warm engine's logprobs (the legacy completions shape vLLM streams) become the chat
    shape, per choice; the request asked the engine for them."""
    from evaluator.backends.base import WarmEngineAddress

    _Engine.calls, _Engine.bodies = [], []
    _Engine.logprobs = {  # the end-of-sequence token after the content, as the warm engine sends it
        "tokens": ["2", "</s>"],
        "token_logprobs": [-0.25, -0.5],
        "top_logprobs": [{"2": -0.25, "3": -2.0}, {"</s>": -0.5, "3": -1.0}],
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    warm = WarmEngineAddress(f"http://127.0.0.1:{server.server_port}", None, 10.0)
    try:
        spec = parse_spec(
            {"kind": "generate", "model": tiny_model, "prompt": "1 + 1 =", "max_tokens": 8, "logprobs": 2}
            | {"backend": "vllm"}
        )
        sink = Recorded()
        run_generate(spec, sink, tiny_model, warm)
    finally:
        server.shutdown()
        _Engine.logprobs = None
    assert _Engine.bodies[-1]["logprobs"] == 2
    (row,) = sink.rows
    assert row["data"]["logprobs"] == [
        {
            "token": "2",
            "logprob": -0.25,
            "bytes": [50],
            "top_logprobs": [
                {"token": "2", "logprob": -0.25, "bytes": [50]},
                {"token": "3", "logprob": -2.0, "bytes": [51]},
            ],
        }
    ]


def test_an_engines_logprobs_cover_the_content_only() -> None:
    """Issue 69.4: the warm engine's logprobs held the stop token and special tokens (22 entries for
    19 characters, ending in <eos>); OpenAI's cover the content."""
    from evaluator.logprobs import content_tokens

    def entries(*pieces: str | bytes) -> list[dict[str, Any]]:
        return [
            {"token": p if isinstance(p, str) else "bytes:" + p.hex(), "logprob": -0.1,
             "bytes": list(p.encode() if isinstance(p, str) else p)}
            for p in pieces
        ]  # fmt: skip

    def kept(tokens: list[dict[str, Any]], text: str) -> list[str]:
        return [t["token"] for t in content_tokens(tokens, text)]

    assert kept(entries("The", " sum", " is", " 42", ".", "<|im_end|>"), "The sum is 42.") == [
        "The",
        " sum",
        " is",
        " 42",
        ".",
    ]
    assert kept(entries("4", "<tool_call>", "2", "<eos>", "<eos>"), "42") == ["4", "2"]  # skipped special tokens
    assert kept(entries("x", " =", " 1", "\n\n", "y"), "x = 1\n") == [
        "x",
        " =",
        " 1",
        "\n\n",
    ]  # a stop string cut inside
    assert kept(entries("≥".encode()[:1], "≥".encode()[1:], "1", "</s>"), "≥1") == ["bytes:e2", "bytes:89a5", "1"]
    assert kept(entries("2", "</s>"), "") == []
    unmatched = entries("a", "\ufffd", "b", "<eos>")
    unmatched[1]["bytes"] = None  # a piece without bytes that the text does not show: the rest kept, bar specials
    assert kept(unmatched, "ab") == ["a", "\ufffd", "b"]


def test_a_batch_answers_each_line_as_a_call_and_a_bad_line_is_its_error(tiny_model: str, tmp_path: Any) -> None:
    """OpenAI's Batch API's job: each line's request answered as its own call (its knobs read as a
    call's: mathrl.specs.generate.sampling_fields), a step per line with its custom_id; a line that
    cannot be answered is stored as its error and the batch goes on."""
    lines = [
        {"custom_id": "greedy", "body": {"model": "m", "prompt": "1 + 1 =", "max_tokens": 5, "temperature": 0}},
        {"custom_id": "too-long", "body": {"model": "m", "prompt": "1 +", "max_tokens": 10**6}},
        # seeded: a draw of its own could end at once, on the end-of-sequence token, and hold no log-probability
        {
            "custom_id": "two",
            "body": {"model": "m", "prompt": "2 +", "max_tokens": 3, "n": 2, "logprobs": 1} | {"seed": 5},
        },
    ]
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps({"method": "POST", "url": "/v1/completions", **x}) + "\n" for x in lines))
    batch = {"file": "file-" + "0" * 32, "endpoint": "/v1/completions"}
    spec = parse_spec({"kind": "generate", "model": tiny_model, "batch": batch, "max_tokens": 8})
    spec.batch._path = str(path)
    sink = Recorded()
    run_generate(spec, sink, tiny_model)
    steps = [(r["data"]["custom_id"], r["data"]["index"]) for r in sink.rows]
    assert steps == [("greedy", 0), ("too-long", 0), ("two", 0), ("two", 1)], steps
    greedy = _generated(tiny_model, prompt="1 + 1 =", max_tokens=5, temperature=0)[0]["completion"]
    assert sink.rows[0]["completion"] == greedy  # the line, as the same call would answer it
    assert "max_tokens" in sink.rows[1]["data"]["error"]["message"] and sink.rows[1]["completion"] == ""
    assert all(len(r["data"]["logprobs"][0]["top_logprobs"]) == 1 for r in sink.rows[2:])
    assert ("progress", "3/3") in sink.events and any(k == "generated" and "2 of 3" in m for k, m in sink.events)
    resumed = Recorded()  # after a drain: an attempt that stored the first two lines
    resumed.steps = (0, 1)
    run_generate(spec, resumed, tiny_model)
    assert [r["data"]["custom_id"] for r in resumed.rows] == ["two", "two"]


def test_a_tokens_bytes_are_its_own_where_it_holds_part_of_a_character(smollm2: str) -> None:
    """A byte-level token that holds part of a character decodes alone to U+FFFD; its `bytes` (what
    a client joins to rebuild the text) were those of U+FFFD, and now are the token's own."""
    from transformers import AutoTokenizer

    from evaluator.logprobs import is_byte_level, token_bytes

    tok = AutoTokenizer.from_pretrained(smollm2)
    assert is_byte_level(tok)
    text = "x ≥ 2 — café, ℵ₀ ⟨x⟩"
    ids = tok(text, add_special_tokens=False).input_ids
    pieces = [token_bytes(tok, i, True) or tok.decode([i]).encode() for i in ids]
    assert b"".join(pieces).decode() == text, pieces
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # ℵ's bytes span tokens here


def test_a_batch_sends_its_lines_to_a_warm_engine_together(tiny_model: str, tmp_path: Any) -> None:
    """A batch on a warm engine sent its lines one after another, so the engine's continuous batching
    had one request at a time: now `in_flight` go at once, each line stored once."""
    from evaluator.backends.base import WarmEngineAddress
    from evaluator.chat import run_batch

    lines = [{"custom_id": f"r{i}", "body": {"model": "m", "prompt": f"{i} +", "max_tokens": 4}} for i in range(12)]
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps({"method": "POST", "url": "/v1/completions", **x}) + "\n" for x in lines))
    batch = {"file": "file-" + "0" * 32, "endpoint": "/v1/completions"}
    spec = parse_spec({"kind": "generate", "model": tiny_model, "batch": batch, "backend": "vllm"})
    spec.batch._path = str(path)
    _Engine.calls, _Engine.bodies, _Engine.answer_seconds, _Engine.busiest = [], [], 0.3, 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sink = Recorded()
        started = time.monotonic()
        run_batch(spec, sink, tiny_model, WarmEngineAddress(f"http://127.0.0.1:{server.server_port}"), in_flight=4)
        took = time.monotonic() - started
    finally:
        server.shutdown()
        _Engine.answer_seconds = 0.0
    assert sorted(r["data"]["custom_id"] for r in sink.rows) == sorted(x["custom_id"] for x in lines)
    assert _Engine.busiest == 4, _Engine.busiest  # (one at a time before)
    assert _Engine.calls.count("/health") == 1, _Engine.calls  # connected to once, not once a line as before
    print(f"12 lines of 0.3 s each, 4 at once: {took:.2f} s")


def test_a_batchs_lines_with_the_same_knobs_are_generated_together_on_transformers(
    tiny_model: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On transformers a batch answered its lines one generate call each; lines in a row with the same
    knobs now go as one batch: the same greedy text as each call alone, each line's own prompt."""
    from evaluator.chat import run_batch

    asks = ["1 + 1 =", "12 + 30 =", "7 =", "100 + 1 =", "3 + 4 ="]
    lines = [
        {"custom_id": f"r{i}", "body": {"model": "m", "prompt": q, "max_tokens": 6, "temperature": 0}}
        for i, q in enumerate(asks)
    ]
    lines.append({"custom_id": "other", "body": {"model": "m", "prompt": "9 =", "max_tokens": 3, "temperature": 0}})
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps({"method": "POST", "url": "/v1/completions", **x}) + "\n" for x in lines))
    spec = parse_spec(
        {"kind": "generate", "model": tiny_model, "batch": {"file": "file-" + "0" * 32, "endpoint": "/v1/completions"}}
    )
    spec.batch._path = str(path)
    from evaluator.backends.hf_chat import HFChat

    calls: list[int] = []
    answer = HFChat.answer

    def counted(self: Any, prompts: list[str], **kw: Any) -> Any:
        calls.append(len(prompts))
        return answer(self, prompts, **kw)

    monkeypatch.setattr(HFChat, "answer", counted)
    sink = Recorded()
    run_batch(spec, sink, tiny_model, None, in_flight=4)
    assert calls == [4, 1, 1], calls  # r0-r3 together, then r4, then 'other' (its own knobs)
    monkeypatch.undo()
    got = {r["data"]["custom_id"]: r["completion"] for r in sink.rows}
    alone = {
        f"r{i}": _generated(tiny_model, prompt=q, max_tokens=6, temperature=0)[0]["completion"]
        for i, q in enumerate(asks)
    }
    assert {k: got[k] for k in alone} == alone
    assert got["other"] == _generated(tiny_model, prompt="9 =", max_tokens=3, temperature=0)[0]["completion"]
    assert [r["prompt"] for r in sink.rows[:4]] == asks[:4]


VERDICT = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["yes", "no"]},
        "sure": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["verdict", "sure", "n"],
    "additionalProperties": False,
}


def test_a_call_held_to_a_schema_answers_json_the_schema_admits(tiny_model: str) -> None:
    """Issue 69.2: structured outputs on transformers (evaluator/structured.py, xgrammar). The tiny model
    writes random text unheld; held to a schema, every choice, sampled, greedy or streamed, is JSON that
    validates against it, and nothing follows the JSON; json_object holds the answer to an object."""
    import jsonschema

    held = {"type": "json_schema", "json_schema": {"name": "verdict", "strict": True, "schema": VERDICT}}
    chat = [{"role": "user", "content": "Is 2 + 2 = 4?"}]
    free = _answers(tiny_model, prompt=None, messages=chat, max_tokens=60, n=4, seed=1)
    assert not any(a.startswith('{"verdict"') for a in free), free
    for over in ({"n": 4, "temperature": 1.0}, {"temperature": 0.0}, {"stream": True}):
        spec = parse_spec(
            {"kind": "generate", "model": tiny_model, "messages": chat, "max_tokens": 60, "seed": 2}
            | {"response_format": held}
            | over
        )
        sink = Recorded()
        run_generate(spec, sink, tiny_model)
        assert len(sink.rows) == over.get("n", 1)
        for row in sink.rows:
            assert row["data"]["finish_reason"] == "stop", (over, row)
            jsonschema.validate(json.loads(row["completion"]), VERDICT)
    spec = parse_spec(
        {"kind": "generate", "model": tiny_model, "messages": chat, "max_tokens": 8, "n": 3, "seed": 2}
        | {"response_format": {"type": "json_object"}}
    )
    sink = Recorded()
    run_generate(spec, sink, tiny_model)
    for row in sink.rows:  # a cut-short object is a prefix of one; an ended one parses as one
        assert row["completion"].startswith("{"), row
        if row["data"]["finish_reason"] == "stop":
            assert isinstance(json.loads(row["completion"]), dict), row


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {f: {"type": "string", "format": f}}}
        for f in ("date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid")
    ]
    + [
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2}}},
        {"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": ["integer", "null"]}]}}},
        {"type": "object", "properties": {"b": {"type": "array", "prefixItems": [{"type": "string"}], "maxItems": 3}}},
        {
            "type": "object",
            "$defs": {
                "node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}
            },
            "properties": {
                "root": {"$ref": "#/$defs/node"},
                "c": {"const": "x"},
                "m": {"type": "number", "maximum": 1},
            },
        },
    ],
)
def test_every_schema_feature_the_api_admits_compiles_for_the_decoder(tiny_model: str, schema: dict[str, Any]) -> None:
    """What mathrl/specs/response_format.py lets through at submit, xgrammar can hold an answer to:
    a schema the API admits never fails its job at the worker."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evaluator.backends.hf_generate import eos_ids
    from evaluator.structured import constraint
    from mathrl.specs.response_format import ResponseFormat

    ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    tokenizer, model = AutoTokenizer.from_pretrained(tiny_model), AutoModelForCausalLM.from_pretrained(tiny_model)
    assert callable(constraint(model, tokenizer, schema, eos_ids(model, tokenizer)))


def test_every_call_goes_through_its_backends_chat_and_vllm_without_a_warm_engine_is_refused() -> None:
    """Issue 68.3: a generate job, a batch and a grading model each ask `backend(name).chat(...)` for
    the model that answers them. Each registered backend's `Chat` is what the SDK's registry says it
    answers with (`BackendInfo.chats`); 'auto' picks the warm engine the job was given, else
    transformers; vLLM without a warm engine is refused, naming the setting, never answered on
    transformers instead; and a grading model is neither resolved nor loaded before its first call."""
    from evaluator.backends import BACKENDS, BackendOptions
    from evaluator.backends.base import WarmEngineAddress
    from evaluator.backends.hf_chat import HFChat
    from evaluator.backends.warm import WarmChat
    from evaluator.chat import chat_for, judges
    from mathrl.backends import GENERATION_BACKENDS
    from runtime.errors import NotAvailable

    warm = WarmEngineAddress("http://127.0.0.1:9", None, 1.0)
    answers_with = {"transformers": HFChat, "warm engine": WarmChat}
    for name, cls in BACKENDS.items():
        info = GENERATION_BACKENDS[name]
        assert info.chats is not None, name  # (a backend with none: the generate spec refuses it, test_specs.py)
        assert type(cls(BackendOptions(warm=warm)).chat("unused")) is answers_with[info.chats], name
    assert isinstance(chat_for("auto", "unused"), HFChat)
    assert isinstance(chat_for("auto", "unused", warm=warm), WarmChat)
    assert isinstance(chat_for("hf", "unused", warm=warm), HFChat)
    with pytest.raises(NotAvailable, match="warm_engines is 0.*set backend to 'auto' or 'hf'"):
        chat_for("vllm", "unused")

    def refuse(ref: str) -> str:
        raise AssertionError(f"{ref} resolved before its first call")

    held: dict[str, Any] = {}
    judges(refuse, held, warm)("ref")  # the warm engine answers: nothing resolved or loaded here
    judges(refuse, held)("other")  # transformers: resolved and loaded at the first chat it answers
    assert type(held["ref"]) is WarmChat and type(held["other"]) is HFChat
