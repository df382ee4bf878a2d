"""The worker's warm vLLM engine (worker/warm_engine.py) as a job's process reaches it: `connect`
(its model and context, a LoRA adapter loaded into it) and `WarmChat`, the `Chat` on it
(`VLLM.chat`): a call goes to the engine's own /v1/chat/completions or /v1/completions, streamed,
its deltas stored. A call the engine's context cannot hold, or one with functions (read out of the
text on transformers), is answered on transformers in this process instead (`HFChat`, loaded only
then)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from evaluator.backends.base import WarmEngineAddress
from evaluator.backends.chat_base import Chat, Choice, Deltas, NoDeltas, judge_params, rows
from evaluator.backends.hf_chat import HFChat
from evaluator.logprobs import Token, content_tokens, from_completion_chunk
from runtime.errors import StopRequested

if TYPE_CHECKING:
    from mathrl.specs import GenerateSpec
    from runtime.sink import Sink


class RemoteEngine:
    """A vLLM OpenAI server the worker keeps warm between eval jobs (worker/warm_engine.py)."""

    def __init__(self, url: str, max_model_len: int, model: str, cache_salt: str | None = None):
        self.url, self.max_model_len, self.model = url.rstrip("/"), max_model_len, model
        self.cache_salt = cache_salt  # the job's project's (WarmEngineAddress.cache_salt)

    def salted(self, body: dict[str, Any]) -> dict[str, Any]:
        """A request's body, its prompt's cached blocks the project's own."""
        return {**body, "cache_salt": self.cache_salt} if self.cache_salt else body


def connect(warm: WarmEngineAddress, should_stop: Callable[[], bool] | None = None) -> RemoteEngine:
    """Wait up to `warm.start_seconds` for the server at `warm.url` to answer /health (a new one
    loads and compiles first) and read the model name and context length it serves. With
    `warm.adapter` (the job's model is a LoRA checkpoint of the engine's model), the adapter is
    loaded into the engine under a name of its own, unless it is already, and that name is what the
    requests ask for."""
    import time

    import httpx

    url, timeout, adapter = warm.url, warm.start_seconds, warm.adapter
    deadline = time.monotonic() + timeout
    while True:
        if should_stop is not None and should_stop():
            raise StopRequested("stop requested")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                cards = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
                base = cards[0]
                model = base["id"] if adapter is None else load_adapter(url, adapter, cards)
                return RemoteEngine(url, int(base["max_model_len"]), model, warm.cache_salt)
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker's vLLM engine at {url} did not answer /health in {timeout:.0f}s")
        time.sleep(0.5)


def adapter_name(path: str) -> str:
    """The name a LoRA adapter directory is served under: one per path (checkpoints never change)."""
    import hashlib

    return "adapter-" + hashlib.sha256(path.encode()).hexdigest()[:16]


def load_adapter(url: str, path: str, cards: list[dict[str, Any]]) -> str:
    """Load the LoRA adapter at `path` into the server at `url` (`cards`: what it serves now),
    unless it is there already; its served name."""
    import httpx

    name = adapter_name(path)
    if any(card["id"] == name for card in cards):
        return name
    r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path}, timeout=300)
    if r.status_code != 200:
        raise RuntimeError(f"the warm engine did not load the LoRA adapter {path}: {r.status_code} {r.text[:300]}")
    return name


class WarmChat(Chat):
    """The warm engine at `warm`; `fallback`: the job's model on transformers, for the calls the
    engine does not take."""

    together = False

    def __init__(self, warm: WarmEngineAddress, fallback: HFChat):
        self.warm, self.fallback = warm, fallback
        self._engine: RemoteEngine | None = None
        self._lock = threading.Lock()

    def engine(self, should_stop: Callable[[], bool] | None = None) -> RemoteEngine:
        """The engine, connected to once (`connect`: its health, model, context and the job's adapter
        loaded), not again for each call or batch line."""
        with self._lock:
            if self._engine is None:
                self._engine = connect(self.warm, should_stop)
            return self._engine

    def prepare(self) -> None:
        """Nothing: the engine holds its model, and transformers' loads for the first call it does not take."""

    def call(self, spec: GenerateSpec, sink: Sink, deltas: Deltas) -> list[dict[str, Any]]:
        engine = holding(spec, sink, self.engine(sink.should_stop)) if not spec.function_tools else None
        if engine is None:
            return self.fallback.call(spec, sink, deltas)
        # cached: the prompt's tokens found in the engine's prefix cache (its project's own: cache_salt)
        prompt_tokens, cached_tokens, choices = generate_remote(spec, engine, deltas)
        prompt = (spec.prompt or "") if spec.messages is None else json.dumps([m.model_dump() for m in spec.messages])
        return rows(prompt, prompt_tokens, cached_tokens, choices)

    def calls(self, specs: list[GenerateSpec], sink: Sink) -> list[list[dict[str, Any]]]:
        return [self.call(spec, sink, NoDeltas()) for spec in specs]

    def here(self) -> HFChat:
        return self.fallback

    def judge(self, chats: Sequence[list[dict[str, str]]], params: Mapping[str, Any]) -> list[str]:
        return judge_remote(self.engine(), chats, judge_params(params))


def holding(spec: GenerateSpec, sink: Sink, engine: RemoteEngine) -> RemoteEngine | None:
    """The warm engine, where the call's prompt and max_tokens fit its context
    (worker.warm_engine_max_model_len, 4096 by default, not the model's own); None: answer with
    transformers, as an eval that needs more loads an engine of its own. Before, the engine refused
    such a call (vLLM's 400) and the client got a 502 where OpenAI answers."""
    import httpx

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


def generate_remote(spec: GenerateSpec, engine: RemoteEngine, deltas: Deltas) -> tuple[int, int, list[Choice]]:
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


def judge_remote(engine: RemoteEngine, chats: Sequence[list[dict[str, str]]], p: Mapping[str, Any]) -> list[str]:
    """The chats sent to the warm engine's own /v1/chat/completions at once (its scheduler batches
    them), with the sampling parameters transformers would use."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

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
