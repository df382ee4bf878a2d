"""A tiny Qwen2-architecture model with a character-level tokenizer, built locally.

Used by the laptop demo, the tests and the benchmarks: it needs no download, loads in
well under a second and runs every code path a real model does (chat template included).
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHARS = sorted(set(string.printable) - set("\x0b\x0c\r\t"))

# A minimal ChatML template, so chat-template code paths run on the tiny model too.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(chat: bool = False) -> PreTrainedTokenizerFast:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # specials first, then one token per character
    core.pre_tokenizer = pre_tokenizers.Split(
        Regex(r"<\|im_start\|>|<\|im_end\|>|<eos>|<bos>|<pad>|[\s\S]"), behavior="isolated"
    )
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    chat: bool = False,
    max_positions: int = 2048,
    arch: str = "qwen2",
) -> Path:
    """Write a randomly initialised tiny model and its tokenizer to out_dir. `arch` 'llama': the same
    shape as a Llama, whose tokenizer transformers 5 loads from tokenizer.json as written (a qwen2
    model's it loads as Qwen2Tokenizer, which drops this tokenizer's spaces and newlines)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    tok = build_tokenizer(chat=chat)
    torch.manual_seed(seed)
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_class(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    model = model_class(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
