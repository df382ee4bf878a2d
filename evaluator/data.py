"""Loading problems: one code path through `datasets` for hub ids and local files alike."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from evaluator.benchmarks import Benchmark
from evaluator.grading import gsm8k_gold

log = logging.getLogger(__name__)


@dataclass
class Problem:
    index: int
    question: str
    gold: str
    meta: dict[str, Any] = field(default_factory=dict)
    solution: str | None = None


def _load_rows(source: str, split: str, config: str | None, data_file: str | Path | None) -> Any:
    """`data_file`: a local path, a file:// URL or an http(s) URL (admitted by api/admission.py)."""
    import datasets

    datasets.disable_progress_bars()
    if data_file is not None:
        data_file = str(data_file)
        if data_file.startswith("file://"):
            data_file = unquote(urlsplit(data_file).path)
        fmt = "parquet" if data_file.endswith(".parquet") else "json"
        return datasets.load_dataset(fmt, data_files=data_file, split="train")
    return datasets.load_dataset(source, config, split=split)


def load_benchmark(bench: Benchmark, data_dir: str | None, limit: int | None = None) -> list[Problem]:
    """Rows of a registered benchmark: the offline copy when the data dir has it, else the hub."""
    if bench.synthetic:
        from evaluator import synthetic

        return synthetic.heldout(limit) if bench.split == "test" else synthetic.train(limit or 10_000)
    local = Path(data_dir) / bench.local_file if data_dir and bench.local_file else None
    if local is not None and not local.exists():
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise FileNotFoundError(f"{bench.name}: no offline copy at {local} and the hub is off")
        log.info("%s: %s not found, loading %s from the hub", bench.name, local, bench.hub_id)
        local = None
    rows = _load_rows(bench.hub_id, bench.split, bench.hub_config, local)
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    problems = []
    for i, row in enumerate(rows):
        raw_answer = row[bench.answer_field]
        if raw_answer is None:
            continue  # MATH train has 2 rows without an extractable answer
        gold = gsm8k_gold(raw_answer) if bench.gold_format == "gsm8k" else str(raw_answer)
        meta = {k: row[k] for k in bench.meta_fields if k in row}
        problems.append(
            Problem(index=i, question=row[bench.question_field], gold=gold, meta=meta, solution=row.get("solution") or raw_answer)
        )
    return problems


def load_user_set(path: str | Path, question_field: str, answer_field: str, limit: int | None = None) -> list[Problem]:
    rows = _load_rows("", "train", None, path)
    missing = [f for f in (question_field, answer_field) if f not in rows.column_names]
    if missing:
        raise ValueError(f"{str(path).rsplit('/', 1)[-1]} has no field(s) {missing}; it has {rows.column_names}: set question_field/answer_field")
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    out = []
    for i, row in enumerate(rows):
        gold = str(row[answer_field])
        if "####" in gold:
            gold = gsm8k_gold(gold)
        out.append(Problem(index=i, question=str(row[question_field]), gold=gold))
    return out
