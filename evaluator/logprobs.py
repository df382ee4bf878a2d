"""Log-probabilities of a completion's tokens, as OpenAI's `logprobs` returns them: each new
token's, and the most likely tokens in its place (`top_logprobs`), under the model's own
distribution (no temperature, no top_p: what OpenAI and vLLM report). A generate job asks for
them (mathrl.specs.GenerateSpec.logprobs); on transformers they come from one teacher-forced
forward pass over the prompt and the tokens the completion kept (evaluator/chat.py), on a warm
vLLM engine from the engine itself.

One token is `{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}`,
OpenAI's chat shape; `as_completion_logprobs` turns a list of them into the legacy completions
shape."""

from __future__ import annotations

import re
from typing import Any

Token = dict[str, Any]


def _entry(text: str, logprob: float, raw: bytes | None = None) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8") if raw is None else raw)}


def _byte_level() -> dict[str, int]:
    """GPT-2's byte-level alphabet (ByteLevel BPE: Qwen, Llama 3, SmolLM2): the character each byte is
    written as in a token's piece, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: b for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = 256 + extra, extra + 1
    return {chr(c): b for b, c in chars.items()}


BYTE_LEVEL = _byte_level()
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


def is_byte_level(tokenizer: Any) -> bool:
    """The tokenizer writes its pieces in the byte-level alphabet (its decoder says ByteLevel)."""
    return "ByteLevel" in repr(getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None))


def token_bytes(tokenizer: Any, token_id: int, byte_level: bool) -> bytes | None:
    """A token's own bytes, where its piece says them (a byte-level piece, or a byte-fallback token):
    a token that holds part of a character decodes alone to U+FFFD, its bytes do not. None: the
    decoded text's bytes are the token's."""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if not isinstance(piece, str) or not piece:
        return None
    if m := _BYTE_TOKEN.fullmatch(piece):
        return bytes([int(m.group(1), 16)])
    if byte_level and all(c in BYTE_LEVEL for c in piece):  # 'Ġ' a space, 'âī¥' the bytes of '≥'
        return bytes(BYTE_LEVEL[c] for c in piece)
    return None


def kept_tokens(tokenizer: Any, ids: list[int], stop_ids: list[int], text: str) -> list[int]:
    """The new tokens that make up `text`, the completion as it was cut: those before the first
    end-of-sequence token, and, where a stop string cut the text, up to the token that reached its
    end (a token the stop string begins inside stays whole, as vLLM's count keeps it)."""
    stops = set(stop_ids)
    ended = next((i for i, t in enumerate(ids) if t in stops), len(ids))
    ids = ids[:ended]
    if len(tokenizer.decode(ids, skip_special_tokens=True)) <= len(text):
        return ids
    for k in range(1, len(ids) + 1):
        if len(tokenizer.decode(ids[:k], skip_special_tokens=True)) >= len(text):
            return ids[:k]
    return ids


def token_logprobs(model: Any, tokenizer: Any, prompt_ids: list[int], ids: list[int], top: int) -> list[Token]:
    """Each of `ids`' log-probability after `prompt_ids` and what came before it, with the `top`
    most likely tokens in its place: one forward pass, float32 log-softmax of the logits."""
    import torch

    if not ids:
        return []
    seq = torch.tensor([prompt_ids + ids], device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=seq).logits[0, len(prompt_ids) - 1 : -1].to(torch.float32)
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(1, torch.tensor(ids, device=logp.device)[:, None])[:, 0].tolist()
    best = logp.topk(top, dim=-1) if top else None
    level = is_byte_level(tokenizer)
    out: list[Token] = []
    for i, (t, lp) in enumerate(zip(ids, chosen, strict=True)):
        alternatives = []
        if best is not None:
            alternatives = [
                _entry(tokenizer.decode([a]), v, token_bytes(tokenizer, a, level))
                for a, v in zip(best.indices[i].tolist(), best.values[i].tolist(), strict=True)
            ]
        entry = _entry(tokenizer.decode([t]), lp, token_bytes(tokenizer, t, level))
        out.append({**entry, "top_logprobs": alternatives})
    return out


_SPECIAL = re.compile(r"<\|[^<>|]*\|>|<[^<>\s]{1,40}>")  # '<|im_end|>', '<eos>', '</s>', '<tool_call>'


def content_tokens(tokens: list[Token], text: str) -> list[Token]:
    """The engine's token entries that make up `text`, the choice's content, as OpenAI's cover it:
    the end-of-sequence token after it, the tokens of a stop string that cut it, and special tokens
    that the text skipped are dropped (the warm vLLM engine sent 22 entries for 19 characters, the
    last `<eos>`). Entries are matched to the text by their bytes; a token that the text ends inside
    stays whole (as `kept_tokens` keeps it on transformers). Where an entry's bytes cannot be matched
    (a piece no text shows), the rest is kept but for special tokens."""
    want, at, out = text.encode("utf-8"), 0, []
    for i, t in enumerate(tokens):
        raw = bytes(t["bytes"]) if t.get("bytes") is not None else str(t.get("token", "")).encode("utf-8")
        if at >= len(want):
            break  # past the content: the stop token, a stop string's tokens
        if raw and want.startswith(raw, at):
            out.append(t)
            at += len(raw)
        elif raw and raw.startswith(want[at:]):
            out.append(t)  # the text ends inside it
            break
        elif _SPECIAL.fullmatch(str(t.get("token", ""))):
            continue  # skipped by the text
        else:  # not matched: keep what is left, but for special tokens
            out += [u for u in tokens[i:] if not _SPECIAL.fullmatch(str(u.get("token", "")))]
            break
    return out


def from_completion_chunk(logprobs: dict[str, Any]) -> list[Token]:
    """A vLLM /v1/completions chunk's `logprobs` (tokens, token_logprobs, top_logprobs as
    token -> logprob) as tokens of the chat shape."""
    tops = logprobs.get("top_logprobs") or [None] * len(logprobs.get("tokens") or [])
    return [
        {
            **_entry(t, float(lp if lp is not None else float("-inf"))),
            "top_logprobs": [_entry(k, float(v)) for k, v in sorted((alts or {}).items(), key=lambda kv: -kv[1])],
        }
        for t, lp, alts in zip(logprobs.get("tokens") or [], logprobs.get("token_logprobs") or [], tops, strict=False)
    ]


def as_completion_logprobs(tokens: list[Token]) -> dict[str, Any]:
    """The legacy completions shape: tokens, token_logprobs, top_logprobs (token -> logprob) and
    text_offset (each token's start in the completion's text)."""
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t["token"])
    return {
        "tokens": [t["token"] for t in tokens],
        "token_logprobs": [t["logprob"] for t in tokens],
        "top_logprobs": [{a["token"]: a["logprob"] for a in t["top_logprobs"]} for t in tokens],
        "text_offset": offsets,
    }
