"""Sampling from a training session's model (Tinker's `sample` and `compute_logprobs`), with
transformers' `generate` on the session's own model: the adapter as a sampler snapshot holds it
(`lora_weights`/`use_weights`), the base model's weights shared with training.

Log-probabilities are the model's (temperature 1) of each sampled token, what the learner computes
for the same token in `forward_backward`, so an importance-sampling ratio starts at 1."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from mathrl.specs.generate import MAX_TOKENS
from trainer.session import TrainingSession
from trainer.session_wire import Sampled


@dataclass(frozen=True)
class SampleCall:
    """A decoded `asample` request (docs/tinker-protocol.md, section 9)."""

    prompt: list[int]
    num_samples: int = 1
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] | list[int] | None = None  # None: the tokenizer's EOS; []: nothing stops it
    seed: int | None = None
    prompt_logprobs: bool = False
    prompt_logprobs_last_n: int | None = None


def sample_call(body: Mapping[str, Any]) -> SampleCall:
    """An `asample` JSON body as a call; ValueError naming the field that cannot be served."""
    tokens: list[int] = []
    for i, chunk in enumerate((body.get("prompt") or {}).get("chunks") or []):
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise ValueError(f"prompt.chunks[{i}]: only encoded_text chunks are supported (no images)")
        tokens.extend(int(t) for t in chunk.get("tokens") or [])
    if not tokens:
        raise ValueError("prompt: give at least one token")
    params = body.get("sampling_params") or {}
    stop = params.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if int(body.get("topk_prompt_logprobs") or 0) or int(body.get("topk_sample_logprobs") or 0):
        raise ValueError("topk_prompt_logprobs/topk_sample_logprobs: top-k log-probabilities are not served; send 0")
    n = int(1 if body.get("num_samples") is None else body["num_samples"])  # 0 is 0: refused, not one sample
    if not 1 <= n <= 128:
        raise ValueError(f"num_samples: {n} is out of range; give 1 to 128")
    max_tokens = params.get("max_tokens")
    if max_tokens is not None and not 1 <= int(max_tokens) <= MAX_TOKENS:
        raise ValueError(f"sampling_params.max_tokens: {max_tokens} is out of range; give 1 to {MAX_TOKENS}")
    temperature, top_p = float(params.get("temperature", 1.0)), float(params.get("top_p", 1.0))
    if not 0.0 <= temperature <= 100.0:  # NaN fails too; a negative one was served as greedy
        raise ValueError(f"sampling_params.temperature: {temperature} is out of range; give 0 (greedy) to 100")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"sampling_params.top_p: {top_p} is out of range; give more than 0, at most 1")
    return SampleCall(
        prompt=tokens,
        num_samples=n,
        max_tokens=None if max_tokens is None else int(max_tokens),
        temperature=temperature,
        top_p=top_p,
        top_k=int(params.get("top_k", -1)),
        stop=stop,
        seed=params.get("seed"),
        prompt_logprobs=bool(body.get("prompt_logprobs")),
        prompt_logprobs_last_n=body.get("prompt_logprobs_last_n"),
    )


def lora_weights(session: TrainingSession) -> dict[str, Any]:
    """A copy of the adapter's weights now: a sampler's snapshot."""
    return {name: p.detach().clone() for name, p in session.model.named_parameters() if p.requires_grad}


@contextmanager
def use_weights(session: TrainingSession, weights: Mapping[str, Any] | None) -> Iterator[None]:
    """The model with these adapter weights (None: as it is) for the block, then as it was; the
    accumulated gradients are untouched, so a sample between forward_backward calls changes no step."""
    import torch

    was_training = session.model.training
    session.model.eval()
    saved = lora_weights(session) if weights is not None else {}
    try:
        with torch.no_grad():
            if weights is not None:
                for name, p in session.model.named_parameters():
                    if name in weights:
                        p.copy_(weights[name])
            yield
    finally:
        with torch.no_grad():
            for name, p in session.model.named_parameters():
                if name in saved:
                    p.copy_(saved[name])
        session.model.train(was_training)


def prompt_logprobs(session: TrainingSession, tokens: Sequence[int], last_n: int | None) -> list[float | None]:
    """Each prompt token's log-probability given the ones before it (the first: None)."""
    import torch

    ids = torch.tensor([list(tokens)], device=session.device)
    logp = torch.log_softmax(session.model(input_ids=ids).logits.float()[0, :-1], dim=-1)
    values: list[float | None] = [None, *logp.gather(-1, ids[0, 1:, None])[:, 0].tolist()]
    if last_n is not None:
        keep = max(len(values) - int(last_n), 0)
        blank: list[float | None] = [None] * keep
        values = blank + values[keep:]
    return values


def sample(session: TrainingSession, call: SampleCall) -> tuple[list[Sampled], list[float | None] | None]:
    """`num_samples` continuations of the prompt, and the prompt's log-probabilities when asked.
    Call it inside `use_weights` (no gradients, eval mode)."""
    import torch

    tok = session.tokenizer
    eos = tok.eos_token_id
    stop_ids: list[int] = []
    stop_strings: list[str] = []
    if call.stop is None:
        stop_ids = [eos] if eos is not None else []
    else:
        for s in call.stop:
            (stop_ids if isinstance(s, int) else stop_strings).append(s)  # type: ignore[arg-type]
    room = getattr(session.model.config, "max_position_embeddings", None) or 2048
    max_new = call.max_tokens if call.max_tokens is not None else max(room - len(call.prompt), 1)
    if call.seed is not None:
        torch.manual_seed(int(call.seed))
    ids = torch.tensor([call.prompt] * call.num_samples, device=session.device)  # greedy too: n rows
    greedy = call.temperature <= 0
    kwargs: dict[str, Any] = {
        "max_new_tokens": int(max_new),
        "do_sample": not greedy,
        "return_dict_in_generate": True,
        "output_logits": True,
        # -1: no token ends a sequence, unless asked (stop_ids); pad with it past the end
        "eos_token_id": stop_ids or None,
        "pad_token_id": tok.pad_token_id if tok.pad_token_id is not None else (eos if eos is not None else 0),
    }
    if not greedy:
        kwargs.update(temperature=call.temperature, top_p=call.top_p, top_k=call.top_k if call.top_k > 0 else 0)
    if stop_strings:
        from transformers import StoppingCriteriaList

        stops = stop_criteria(tok, tuple(stop_strings), len(call.prompt))
        kwargs.update(stopping_criteria=StoppingCriteriaList([stops]))
    if call.num_samples > 1 and len(call.prompt) > 1:
        kwargs.update(past_key_values=shared_prefill(session, call.prompt, call.num_samples))
    out = session.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    new = out.sequences[:, ids.shape[1] :]
    logp = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)  # [n, steps, vocab]
    chosen = logp.gather(-1, new[:, :, None])[:, :, 0]
    sequences = []
    for row, lps in zip(new.tolist(), chosen.tolist(), strict=True):
        at = next((i for i, t in enumerate(row) if t in stop_ids), None)  # a stop token ends it there
        if stop_strings:  # a stop string before it ends it sooner
            text_at = first_stop(row[: len(row) if at is None else at + 1], tok.decode, stop_strings)
            at = text_at if text_at is not None else at
        end, reason = (len(row), "length") if at is None else (at + 1, "stop")
        sequences.append(Sampled(row[:end], [v if math.isfinite(v) else -1e9 for v in lps[:end]], reason))
    prompt_lp = prompt_logprobs(session, call.prompt, call.prompt_logprobs_last_n) if call.prompt_logprobs else None
    return sequences, prompt_lp


def shared_prefill(session: TrainingSession, prompt: list[int], rows: int) -> Any:
    """The key/value cache of all but the prompt's last token, computed once and repeated for each of
    the call's rows: `generate` then runs only the last prompt token and the new ones. Given n rows of
    the same prompt it would compute the prompt n times."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=session.model.config)
    head = torch.tensor([prompt[:-1]], device=session.device)
    session.model(input_ids=head, attention_mask=torch.ones_like(head), past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(rows)
    return cache


def stop_criteria(tok: Any, stops: tuple[str, ...], prompt_len: int) -> Any:
    """A row ends once the text it generated holds a stop string (the prompt's text does not count,
    as in vLLM and Tinker: transformers' `stop_strings` also matched a string that began in the
    prompt, and cut such a sample after one token). Each step decodes only the tail of each row
    that a stop string can span, so a step costs the same at any length; building transformers'
    StopStringCriteria instead took 0.58 s of a 1.1 s `sample` of SmolLM2 (4 samples of 5 tokens),
    on every call. `sample` then cuts each row at its first stop (`first_stop`)."""
    import torch
    from transformers import StoppingCriteria

    window = 4 * max(len(s) for s in stops) + 4  # tokens: even byte-level pieces of a character

    class NewTextStop(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            tails = tok.batch_decode(input_ids[:, prompt_len:][:, -window:])
            return torch.tensor([any(s in t for s in stops) for t in tails], device=input_ids.device)

    return NewTextStop()


def first_stop(row: list[int], decode: Any, stops: list[str]) -> int | None:
    """The first token of `row` whose prefix decodes to text holding one of `stops`, or None. A
    longer prefix's text holds a shorter one's, so this is a binary search: O(log n) decodes of
    the prefixes, where checking each prefix in turn was O(n) decodes of O(n) tokens each."""

    def holds(n: int) -> bool:
        text = decode(row[:n])
        return any(s in text for s in stops)

    if not row or not holds(len(row)):
        return None
    lo, hi = 1, len(row)  # the shortest prefix length that holds a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo - 1
