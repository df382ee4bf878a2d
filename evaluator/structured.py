"""Structured outputs on transformers: a generate call held to a JSON Schema (mathrl/specs/response_format.py)
decodes through xgrammar, the grammar engine vLLM's own structured outputs use. Each decoding step
masks the tokens the schema does not admit there; once the JSON is whole, only an end-of-sequence
token is left, so the answer is the JSON and nothing after it. The answer is compact (no free
whitespace between tokens): a small model left free to write spaces can fill its budget with them."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_compilers: dict[int, Any] = {}  # id(tokenizer) -> (tokenizer, xgrammar.GrammarCompiler): one per model loaded


def constraint(model: Any, tokenizer: Any, schema: dict[str, Any], stop_ids: list[int]) -> Callable[[], Any]:
    """A maker of logits processors (one per `model.generate` call: each keeps its rows' state) that
    hold the answer to `schema`. Compiling happens here, once: a schema xgrammar cannot serve raises
    ValueError naming why."""
    import xgrammar as xgr
    from xgrammar.contrib.hf import LogitsProcessor

    with _lock:
        held = _compilers.get(id(tokenizer))
        if held is None or held[0] is not tokenizer:
            vocab = max(int(model.config.vocab_size), len(tokenizer))  # the logits' width (it may be padded)
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=list(stop_ids))
            held = _compilers[id(tokenizer)] = (tokenizer, xgr.GrammarCompiler(info))
    try:
        compiled = held[1].compile_json_schema(json.dumps(schema), any_whitespace=False)
    except (RuntimeError, ValueError) as exc:  # xgrammar's own refusal: the job fails naming it
        raise ValueError(f"the response_format schema cannot be decoded: {exc}") from None
    return lambda: LogitsProcessor(compiled)
