"""Run by tests/system/test_vllm.py in a process of its own (vLLM's engine wants a __main__): one
GRPO step with the python tool on the colocated vLLM engine (trainer/tool_grpo.py), on a tiny
Llama taught to call the tool: in code blocks (scored held-out with the tool as well), or with
`chat-template` through Qwen2.5's template's own calls. Prints the step's tool metrics and what the
rollouts held, as JSON.

    python tests/helpers/tool_grpo_vllm.py OUT_DIR [code-blocks|chat-template]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(out: str, fmt: str = "code-blocks") -> None:
    from tests.unit.trainer.test_tool_chat_template import CHAT_TOOL_JOB, taught_chat_model
    from tests.unit.trainer.test_tool_grpo import _heldout_file, run_tool_job, taught_model
    from trainer.tool_grpo import ToolRollouts

    vllm = {"backend": "vllm", "mode": "colocate"}
    if fmt == "chat-template":
        model, data = taught_chat_model(Path(out), hidden_size=128, heads=2)
        run = lambda: run_tool_job(model, data, Path(out) / "run", generation=vllm, **CHAT_TOOL_JOB)  # noqa: E731
    else:
        model, data = taught_model(Path(out), hidden_size=128, heads=2)
        heldout = _heldout_file(model, Path(out) / "heldout.jsonl")  # scored on the colocated engine with the tool
        run = lambda: run_tool_job(model, data, Path(out) / "run", heldout, generation=vllm)  # noqa: E731
    held: dict[str, Any] = {}
    call = ToolRollouts.__call__

    def kept(self: ToolRollouts, prompts: list[str], trainer: Any) -> dict[str, Any]:
        result = call(self, prompts, trainer)
        held.update(result)
        return result

    ToolRollouts.__call__ = kept  # type: ignore[method-assign]
    sink = run()
    tok_texts = []
    from evaluator.models import load_tokenizer

    tok = load_tokenizer(str(model))
    for ids, mask in zip(held["completion_ids"], held["env_mask"], strict=True):
        tok_texts.append(tok.decode([i for i, m in zip(ids, mask, strict=True) if m == 0]))
    result = {
        "metrics": sink.metrics_by_step.get(1, {}),
        "tool_texts": tok_texts,
        "logprobs": [len(lp) == len(ids) for lp, ids in zip(held["logprobs"], held["completion_ids"], strict=True)],
        "answers": held["answer_text"],
        "backend": next((e["data"] or {}).get("backend") for e in sink.events if e["type"] == "generation"),
        "heldout": next((e["data"] for e in sink.events if e["type"] == "heldout"), None),
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])
