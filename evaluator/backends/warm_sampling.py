"""The `vllm` backend's token sampler (`EngineSampler`, evaluator/backends/token_sampler.py): a Tinker
session's samplers on the worker's warm vLLM engine (worker/warm_engine.py). Each sampler's adapter
directory (`SamplerWeights.directory`: a save's own, or written once) is loaded into the engine as a
LoRA adapter as an eval of a LoRA checkpoint is (evaluator/backends/warm.py `connect` and
`load_adapter`), and sampled through the engine's /v1/completions on the prompt's token ids. Where
the worker has no such engine the session samples on `hf` (evaluator/backends/hf_sampling.py).

What comes back is what that path returns: the tokens, each one's log-probability (vLLM's raw
log-probabilities, the model's at temperature 1, as the learner computes them), why it stopped, and
the prompt's log-probabilities when asked."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from evaluator.backends.base import WarmEngineAddress
from evaluator.backends.token_sampler import SampleCall, Sampled, SamplerWeights, TokenSampler
from runtime.errors import EngineError as EngineError  # raised here

TIMEOUT = 600.0  # one call's tokens; a CPU engine is slow on long completions


class EngineSampler(TokenSampler):
    """The warm engine the worker gave the session, and the adapters this session loaded into it
    (their served names)."""

    def __init__(self, warm: WarmEngineAddress) -> None:
        import httpx

        from evaluator.backends.warm import connect

        try:
            # waits for /health, as an eval's; the session's adapters are loaded by name, not `warm.adapter`
            self.engine = connect(WarmEngineAddress(warm.url, None, warm.start_seconds, warm.cache_salt))
        except TimeoutError as exc:
            raise EngineError(str(exc)) from None
        self.url = self.engine.url
        self._http = httpx.Client(timeout=TIMEOUT)
        self._loaded: set[str] = set()  # loaded by this session: unloaded when it ends

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        import httpx

        try:
            r = self._http.post(f"{self.url}{path}", json=body)
        except httpx.HTTPError as exc:
            raise EngineError(f"{path}: {type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            raise EngineError(f"{path} answered {r.status_code}: {r.text[:300]}")
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text

    def load(self, adapter_dir: Path) -> str:
        """The adapter at `adapter_dir` in the engine (loaded unless it is there already, under the
        name an eval of that directory gets: evaluator.backends.warm.load_adapter); its name."""
        import httpx

        from evaluator.backends.warm import adapter_name, load_adapter

        name = adapter_name(str(adapter_dir))
        if name in self._loaded:
            return name
        try:
            cards = self._http.get(f"{self.url}/v1/models").json()["data"]
            there = any(card["id"] == name for card in cards)
            load_adapter(self.url, str(adapter_dir), cards)
        except (httpx.HTTPError, RuntimeError) as exc:
            raise EngineError(f"loading the adapter {adapter_dir.name}: {exc}") from None
        if not there:  # another job's (an eval of the same save) stays
            self._loaded.add(name)
        return name

    def sample(self, call: SampleCall, weights: SamplerWeights) -> tuple[list[Sampled], list[float | None] | None]:
        """`call` on `weights`' adapter, loaded into the engine at its first call."""
        name = self.load(weights.directory())
        stop_ids = [s for s in call.stop or [] if isinstance(s, int)]
        stop_strings = [s for s in call.stop or [] if isinstance(s, str)]
        greedy = call.temperature <= 0  # vLLM serves n=1 only, greedy: the prompt n times, one each
        body: dict[str, Any] = {
            "model": name,
            "prompt": [list(call.prompt)] * call.num_samples if greedy else list(call.prompt),
            "n": 1 if greedy else call.num_samples,
            "max_tokens": call.max_tokens,
            "temperature": max(call.temperature, 0.0),
            "top_p": call.top_p,
            "top_k": call.top_k if call.top_k > 0 else -1,
            "seed": call.seed,
            "logprobs": 0,  # the sampled token's own
            "return_token_ids": True,
            "skip_special_tokens": False,
            # stop: None is the tokenizer's EOS (the engine's default); a list replaces it, as on transformers
            "ignore_eos": call.stop is not None,
            "stop": stop_strings,
            "stop_token_ids": stop_ids,
            "include_stop_str_in_output": True,
        }
        if call.prompt_logprobs:
            body["prompt_logprobs"] = 0
        out = self._post("/v1/completions", self.engine.salted(body))
        sequences = []
        for choice in sorted(out["choices"], key=lambda c: c["index"]):  # one prompt's n, or n prompts' one
            tokens = [int(t) for t in choice.get("token_ids") or []]
            lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
            values = [float(v) if v is not None and math.isfinite(v) else -1e9 for v in lps]
            reason = "stop" if choice.get("finish_reason") == "stop" else "length"
            sequences.append(Sampled(tokens, values[: len(tokens)], reason))
        prompt_lp = None
        if call.prompt_logprobs:
            prompt_lp = _prompt_logprobs(out["choices"][0].get("prompt_logprobs") or [], call)
        return sequences, prompt_lp

    def close(self) -> None:
        """Unload this session's adapters: the engine stays warm for the worker's next jobs."""
        for name in sorted(self._loaded):
            try:
                self._post("/v1/unload_lora_adapter", {"lora_name": name})
            except EngineError:
                pass  # an engine that went away holds nothing
        self._loaded.clear()
        self._http.close()


def _prompt_logprobs(entries: list[Any], call: SampleCall) -> list[float | None]:
    """vLLM's prompt_logprobs (per position: None, or {token id: {logprob, ...}}) as the prompt
    token's own log-probability, the first None, as the transformers path gives them."""
    values: list[float | None] = []
    for token, entry in zip(call.prompt, entries, strict=False):
        got = (entry or {}).get(str(token)) if entry else None
        values.append(float(got["logprob"]) if got else None)
    blank: list[float | None] = [None] * len(call.prompt)
    values += blank[len(values) :]
    if call.prompt_logprobs_last_n is not None:
        keep = max(len(values) - int(call.prompt_logprobs_last_n), 0)
        values = blank[:keep] + values[keep:]
    return values
