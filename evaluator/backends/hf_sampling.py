"""The `hf` backend's token sampler (`HFTokenSampler`, evaluator/backends/token_sampler.py): transformers'
`generate` on the model in this process, with the weights a sampler holds put in it for the call
(a Tinker session's model: its adapter's snapshot, the base model's weights shared with training).

Log-probabilities are the model's (temperature 1) of each sampled token, what the learner computes
for the same token in `forward_backward`, so an importance-sampling ratio starts at 1."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from evaluator.backends.token_sampler import SampleCall, Sampled, SamplerWeights, TokenSampler


class HFTokenSampler(TokenSampler):
    """Samples on `model` (a transformers causal LM, a peft model included) with `tokenizer`."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.device = next(model.parameters()).device

    def sample(self, call: SampleCall, weights: SamplerWeights) -> tuple[list[Sampled], list[float | None] | None]:
        with weights.held():
            return sample(self.model, self.tokenizer, self.device, call)

    def close(self) -> None:
        pass  # the model is the session's


def prompt_logprobs(model: Any, device: Any, tokens: Sequence[int], last_n: int | None) -> list[float | None]:
    """Each prompt token's log-probability given the ones before it (the first: None)."""
    import torch

    ids = torch.tensor([list(tokens)], device=device)
    logp = torch.log_softmax(model(input_ids=ids).logits.float()[0, :-1], dim=-1)
    values: list[float | None] = [None, *logp.gather(-1, ids[0, 1:, None])[:, 0].tolist()]
    if last_n is not None:
        keep = max(len(values) - int(last_n), 0)
        blank: list[float | None] = [None] * keep
        values = blank + values[keep:]
    return values


def sample(model: Any, tok: Any, device: Any, call: SampleCall) -> tuple[list[Sampled], list[float | None] | None]:
    """`num_samples` continuations of the prompt, and the prompt's log-probabilities when asked.
    Call it with the sampler's weights held (no gradients, eval mode)."""
    import torch

    eos = tok.eos_token_id
    stop_ids: list[int] = []
    stop_strings: list[str] = []
    if call.stop is None:
        stop_ids = [eos] if eos is not None else []
    else:
        for s in call.stop:
            (stop_ids if isinstance(s, int) else stop_strings).append(s)  # type: ignore[arg-type]
    room = getattr(model.config, "max_position_embeddings", None) or 2048
    max_new = call.max_tokens if call.max_tokens is not None else max(room - len(call.prompt), 1)
    if call.seed is not None:
        torch.manual_seed(int(call.seed))
    ids = torch.tensor([call.prompt] * call.num_samples, device=device)  # greedy too: n rows
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
        kwargs.update(past_key_values=shared_prefill(model, device, call.prompt, call.num_samples))
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
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
    prompt_lp = (
        prompt_logprobs(model, device, call.prompt, call.prompt_logprobs_last_n) if call.prompt_logprobs else None
    )
    return sequences, prompt_lp


def shared_prefill(model: Any, device: Any, prompt: list[int], rows: int) -> Any:
    """The key/value cache of all but the prompt's last token, computed once and repeated for each of
    the call's rows: `generate` then runs only the last prompt token and the new ones. Given n rows of
    the same prompt it would compute the prompt n times."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    head = torch.tensor([prompt[:-1]], device=device)
    model(input_ids=head, attention_mask=torch.ones_like(head), past_key_values=cache, use_cache=True)
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
