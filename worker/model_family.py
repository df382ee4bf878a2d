"""Which models one warm vLLM engine can serve by reloading weights in place (worker/warm_engine.py):
those of one *family*, the same architecture, shapes, vocabulary, special tokens, chat template and
generation defaults. The fingerprint reads what those files mean, not how a save wrote them: a
fine-tune differs from its base in `use_cache`, in `eos_token_id: [2]` against `2`, and in
re-serialised tokenizer files, and before this a base and its fine-tune never shared an engine."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

# config.json fields that say nothing of what the engine computes (every save rewrites some)
CONFIG_NOTES = ("_name_or_path", "transformers_version", "use_cache", "pad_token_id", "output_attentions")
GENERATION_NOTES = ("transformers_version", "_from_model_config", "pad_token_id")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "decoder_start_token_id")  # an id or a list of ids: a set
# the tokenizer_config.json fields that change how text becomes tokens or a chat becomes text
TOKENIZER_FIELDS = (
    "bos_token", "eos_token", "unk_token", "add_bos_token", "add_eos_token", "add_prefix_space",
    "clean_up_tokenization_spaces", "do_lower_case", "legacy", "chat_template",
)  # fmt: skip


def model_family(model_path: str) -> str | None:
    """The fingerprint of a model folder's family; None for what cannot be reloaded from disk (a hub id,
    an adapter, a GGUF file: vLLM's reload reads safetensors shards from a directory)."""
    folder = Path(model_path)
    config = _json(folder / "config.json")
    if not isinstance(config, dict) or not any(folder.glob("*.safetensors")):
        return None
    parts = {
        "config": _ids_as_sets(_without(config, CONFIG_NOTES)),
        "generation": _ids_as_sets(_without(_json(folder / "generation_config.json") or {}, GENERATION_NOTES)),
        "tokenizer": _tokenizer(folder),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _without(d: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys} if isinstance(d, dict) else {}


def _ids_as_sets(d: dict[str, Any]) -> dict[str, Any]:
    """`eos_token_id: 2` and `[2]` are one stop (a nested text_config's too)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if k in TOKEN_IDS and v is not None:
            out[k] = sorted(set(v if isinstance(v, list) else [v]))
        else:
            out[k] = _ids_as_sets(v) if isinstance(v, dict) else v
    return out


def _token(v: Any) -> Any:
    """A special token as its text: a save writes `"<eos>"` or `{"content": "<eos>", ...}`."""
    return v.get("content") if isinstance(v, dict) else v


def _tokenizer(folder: Path) -> dict[str, Any]:
    """What the tokenizer's files say, in one shape whichever file holds it."""
    out: dict[str, Any] = {}
    fast = _json(folder / "tokenizer.json")
    if isinstance(fast, dict):
        model = dict(fast.get("model") or {})
        merges = model.get("merges")
        if isinstance(merges, list):  # 'a b' or ['a', 'b'], as the tokenizers version wrote it
            model["merges"] = [" ".join(m) if isinstance(m, list) else m for m in merges]
        out["model"] = _dropped_nulls(model)
        added = fast.get("added_tokens") or []
        out["added"] = sorted((t.get("id"), t.get("content"), bool(t.get("special"))) for t in added)
        for k in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
            out[k] = _dropped_nulls(fast.get(k))
    config = _json(folder / "tokenizer_config.json")
    config = config if isinstance(config, dict) else {}
    special = _json(folder / "special_tokens_map.json")
    special = special if isinstance(special, dict) else {}
    for k in TOKENIZER_FIELDS:
        v = _token(config.get(k, special.get(k)))
        if v is not None:
            out[k] = v
    template = folder / "chat_template.jinja"
    if template.is_file():  # newer saves keep the template here, older ones in tokenizer_config.json
        out["chat_template"] = template.read_text(encoding="utf-8")
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict) and "added" not in out:
        out["added"] = sorted((int(i), _token(t), bool(t.get("special"))) for i, t in decoder.items())
    vocab = _json(folder / "vocab.json")
    if vocab is not None:
        out["vocab"] = vocab
    for name in ("merges.txt", "tokenizer.model"):  # a slow tokenizer's files: their bytes
        f = folder / name
        if f.is_file():
            out[name] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _dropped_nulls(v: Any) -> Any:
    """The value without null fields (a newer tokenizers writes `"dropout": null` where an older wrote none)."""
    if isinstance(v, dict):
        return {k: _dropped_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_dropped_nulls(x) for x in v]
    return v
