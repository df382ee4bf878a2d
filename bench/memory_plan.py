"""Measure one GPU's memory in TRL GRPO steps, next to what trainer/memory_plan.py estimates for
them: the calibration of its activation constants (tests/unit/mathrl/test_memory_plan.py::MEASURED holds the
H100 readings this script gave). Needs a CUDA GPU; no hub: the model is a randomly initialised
Qwen2 of a published shape, the tokenizer a word-level one over its vocabulary, and generation is
TRL's hf backend (its peak is reset once generation ends, so the step's peak is training alone).

    python bench/memory_plan.py q15-full-nogc-8-256-512 [...]

Each run is <shape>-<full|lora>-<gc|nogc>-<micro-batch>-<prompt tokens>-<completion tokens>
(shapes: q05, q15, q7 = Qwen2.5-0.5B/1.5B/7B; LoRA: r=16 on all linear layers) in a fresh
process, two optimizer steps; the second step's peak is reported (the first has no AdamW state
yet). Output: one JSON line per run with the measured and the estimated bytes.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SHAPES: dict[str, dict[str, Any]] = {
    "q05": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "q15": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "q7": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}  # fmt: skip


def memory_plan() -> Any:
    """trainer/memory_plan.py alone (pure Python): a GPU box with torch and TRL needs nothing of the SDK."""
    import importlib.util

    if "mathrl_memory_plan" not in sys.modules:
        spec = importlib.util.spec_from_file_location("mathrl_memory_plan", ROOT / "trainer" / "memory_plan.py")
        assert spec is not None and spec.loader is not None
        sys.modules["mathrl_memory_plan"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["mathrl_memory_plan"]


def parse(name: str) -> tuple[str, bool, bool, int, int, int]:
    shape, kind, gc, batch, prompt, completion = name.split("-")
    return shape, kind == "lora", gc == "gc", int(batch), int(prompt), int(completion)


def word_tokenizer(vocab: int) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t0", pad_token="t2", unk_token="t1")


class RandomReward:
    __name__ = "random"

    def __call__(self, completions: list[Any], **_: Any) -> list[float]:
        return [random.random() for _ in completions]


def measure(name: str) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, Qwen2Config, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    ModelShape, Training, estimate = memory_plan().ModelShape, memory_plan().Training, memory_plan().estimate
    shape, lora, gc, batch, prompt, completion = parse(name)
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096)
    with torch.device("cuda"):  # float32, as TRL loads a path without model_init_kwargs
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    words = [" ".join(f"t{random.randint(10, 1000)}" for _ in range(prompt)) for _ in range(64)]
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM"
        )
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=batch,
        num_generations=batch,
        max_completion_length=completion,
        max_steps=2,
        bf16=True,
        gradient_checkpointing=gc,
        report_to=[],
        save_strategy="no",
        use_vllm=False,
        beta=0.0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    steps: list[dict[str, int]] = []
    total = torch.cuda.mem_get_info()[1]

    class Record(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *_: Any, **__: Any) -> None:
            torch.cuda.synchronize()
            free = torch.cuda.mem_get_info()[0]
            steps.append({"peak_allocated": torch.cuda.max_memory_allocated(), "in_use": total - free})

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[RandomReward()],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": w} for w in words]),
        processing_class=word_tokenizer(config.vocab_size),
        peft_config=peft_config,
        callbacks=[Record()],
    )
    generate = trainer._generate_and_score_completions

    def then_reset(*a: Any, **k: Any) -> Any:
        out = generate(*a, **k)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()  # the step's peak from here: training alone
        return out

    trainer._generate_and_score_completions = then_reset
    trainer.train()
    plan = estimate(
        ModelShape.from_config({**SHAPES[shape], "model_type": "qwen2"}),
        Training(
            micro_batch=batch, seq_len=prompt + completion, lora_r=16 if lora else None, gradient_checkpointing=gc
        ),
        total,
    )
    torch_part = plan.peak - plan.terms["allocator_slack"] - plan.terms["cuda_overhead"]
    return {"run": name, **steps[-1], "estimated_torch": torch_part, "estimated": plan.peak}


def main(names: list[str]) -> None:
    if len(names) == 1:
        print(json.dumps(measure(names[0])), flush=True)
        return
    for name in names:  # one process each: nothing of one run's memory is left for the next
        subprocess.run([sys.executable, __file__, name], check=False)


if __name__ == "__main__":
    main(sys.argv[1:] or ["q15-full-nogc-4-256-512", "q15-full-nogc-8-256-512", "q15-full-gc-8-256-512"])
