"""Which tinker-cookbook renderer renders a model's own chat template exactly (docs/tinker.md,
"Which cookbook renderer"): a system, user, assistant, user conversation with the generation
prompt, rendered by the model's tokenizer and by each renderer, compared as text; and each
renderer's stop sequence. Runs in the cookbook's environment, not mathrl's:

    /work/cookbook/bin/python bench/tinker_renderers.py ~/.mathrl/models/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

CONVERSATION = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "42"},
    {"role": "user", "content": "And 5 + 5?"},
]
RENDERERS = ["qwen3_instruct", "qwen3", "qwen3_disable_thinking", "role_colon", "llama3", "tml_v0"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a model directory (its tokenizer and chat template)")
    ap.add_argument("--renderers", default=",".join(RENDERERS))
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != here]  # bench/tinker_cookbook.py
    from tinker_cookbook import renderers  # the cookbook's environment
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(args.model)
    want = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    for name in args.renderers.split(","):
        try:
            r = renderers.get_renderer(name, tok)
            got = tok.decode(r.build_generation_prompt(CONVERSATION).to_ints())
            stops = [tok.decode([s]) if isinstance(s, int) else s for s in r.get_stop_sequences()]
            print(f"{name:28s} exact={got == want} stops={stops!r}")
        except Exception as e:  # a renderer for another tokenizer family
            print(f"{name:28s} error {type(e).__name__}: {str(e)[:80]}")


if __name__ == "__main__":
    main()
