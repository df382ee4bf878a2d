"""Generation with Hugging Face transformers: left padding, batches sorted by prompt
length (less padding), stop at EOS, n samples per prompt."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BACKEND = "hf"


def backend_version() -> str:
    import torch
    import transformers

    return f"transformers-{transformers.__version__}+torch-{torch.__version__}"


@dataclass
class Generation:
    text: str
    tokens: int
    truncated: bool  # hit max_new_tokens without EOS


def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    max_new_tokens: int,
    stop: list[str] | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    n: int = 1,
    seed: int = 0,
    batch_size: int = 16,
    on_batch: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[list[Generation]]:
    """Return, for each prompt, its n generations (in prompt order). A completion ends at EOS or
    at the first of the `stop` strings, which is cut off (as lm-evaluation-harness does)."""
    import torch

    tokenizer.padding_side = "left"
    stop_ids = eos_ids(model, tokenizer)
    lengths = [len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: -lengths[i])
    results: list[list[Generation]] = [[] for _ in prompts]
    torch.manual_seed(seed)
    done = 0
    per_batch = max(1, batch_size // n) if n > 1 else batch_size
    for start in range(0, len(order), per_batch):
        if should_stop is not None and should_stop():
            raise InterruptedError("stop requested")
        idx = order[start : start + per_batch]
        enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(model.device) for k, v in enc.items()}
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "num_return_sequences": n,
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": stop_ids,
        }
        if stop:
            kwargs.update(stop_strings=list(stop), tokenizer=tokenizer)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.inference_mode():
            out = model.generate(**enc, **kwargs)
        new = out[:, enc["input_ids"].shape[1] :].cpu()
        for row, seq in enumerate(new):
            tokens = seq.tolist()
            ended = [j for j, t in enumerate(tokens) if t in stop_ids]
            count = ended[0] + 1 if ended else len([t for t in tokens if t != tokenizer.pad_token_id])
            text = tokenizer.decode(tokens[: ended[0]] if ended else tokens, skip_special_tokens=True)
            text, stopped = cut_at_stop(text, stop)
            results[idx[row // n]].append(Generation(text=text, tokens=count, truncated=not (ended or stopped)))
        done += len(idx)
        if on_batch is not None:
            on_batch(done, len(prompts))
    return results


def cut_at_stop(text: str, stop: list[str] | None) -> tuple[str, bool]:
    """The text before the earliest stop string, and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stop or [] if s) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list):
            ids.update(eos)
    # chat models often end a turn with a dedicated token (<|im_end|>, <|eot_id|>)
    for special in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(special) if special in tokenizer.get_vocab() else None
        if isinstance(tid, int):
            ids.add(tid)
    return sorted(ids)
