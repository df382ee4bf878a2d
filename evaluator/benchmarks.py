"""The benchmark registry: each benchmark is data (source, split, fields, prompt, grading, version)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Benchmark:
    name: str
    version: str  # bump when the data, prompt or grading changes: scores carry it
    hub_id: str  # production source, loaded with datasets.load_dataset
    hub_config: str | None
    split: str
    local_file: str | None  # offline copy under the data dir (same rows as the hub split)
    question_field: str
    answer_field: str
    gold_format: str  # "gsm8k" (#### n) or "latex"
    prompt: str  # name in evaluator.prompts.TEMPLATES
    description: str = ""
    meta_fields: tuple[str, ...] = field(default_factory=tuple)


REGISTRY: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            name="gsm8k",
            version="1.0",
            hub_id="openai/gsm8k",
            hub_config="main",
            split="test",
            local_file="gsm8k_test.jsonl",
            question_field="question",
            answer_field="answer",
            gold_format="gsm8k",
            prompt="gsm8k",
            description="Grade-school math word problems, 1,319 test questions (Cobbe et al. 2021).",
        ),
        Benchmark(
            name="gsm8k-train",
            version="1.0",
            hub_id="openai/gsm8k",
            hub_config="main",
            split="train",
            local_file="gsm8k_train.jsonl",
            question_field="question",
            answer_field="answer",
            gold_format="gsm8k",
            prompt="gsm8k",
            description="GSM8K train split (7,473), for training questions.",
        ),
        Benchmark(
            name="math500",
            version="1.0",
            hub_id="HuggingFaceH4/MATH-500",
            hub_config=None,
            split="test",
            local_file="math500_test.jsonl",
            question_field="problem",
            answer_field="answer",
            gold_format="latex",
            prompt="math",
            description="MATH-500: the PRM800K test subset of MATH (Lightman et al. 2023).",
            meta_fields=("subject", "level", "unique_id"),
        ),
        Benchmark(
            name="math-train",
            version="1.0",
            hub_id="EleutherAI/hendrycks_math",
            hub_config=None,
            split="train",
            local_file="math_train.jsonl",
            question_field="problem",
            answer_field="answer",
            gold_format="latex",
            prompt="math",
            description="MATH train split (7,500), for training questions.",
            meta_fields=("subject", "level"),
        ),
    )
}


class UnknownBenchmark(ValueError):
    pass


def get_benchmark(name: str) -> Benchmark:
    try:
        return REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, REGISTRY, n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownBenchmark(
            f"unknown benchmark {name!r}.{hint} Known: {', '.join(sorted(REGISTRY))}"
        ) from None
