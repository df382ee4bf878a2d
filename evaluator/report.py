"""An eval's report through the sink: the per-item samples and results file, every metric as a
score with its provenance (model, checkpoint, benchmark and version, sampling, backend, prompt
recipe and hash), MATH's per-subject and per-level accuracy, and the `scored` event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evaluator.benchmarks import Benchmark
from evaluator.data import Problem
from evaluator.metrics import accuracy_breakdown, wilson_interval
from evaluator.scoring import Scored
from runtime.sink import Sink


def write_items(sink: Sink, items: list[dict[str, Any]], results_dir: Path | None, work_dir: Path | None) -> None:
    """The items as the job's samples and, with a results_dir, as results_dir/items.jsonl (written
    in work_dir first when given; the sink moves it)."""
    sink.samples(None, items)
    if results_dir is None:
        return
    written = (work_dir or results_dir) / "items.jsonl"
    written.parent.mkdir(parents=True, exist_ok=True)
    with written.open("w") as f:
        for item in items:
            f.write(json.dumps(item) + "\n")
    sink.checkpoint(
        0, str(results_dir / "items.jsonl"), kind="results", data={"items": len(items)}, source=str(written)
    )


def report_scores(
    sink: Sink, bench: Benchmark, problems: list[Problem], scored: Scored, provenance: dict[str, Any]
) -> dict[str, float]:
    """Every metric as a score, the per-group accuracies, the eval/* metrics and the `scored` event;
    returns the metrics with the groups'."""
    values, intervals = scored.values, scored.intervals
    for metric, value in values.items():
        low, high = intervals.get(metric, (None, None))
        sink.score({**provenance, "metric": metric, "value": value, "ci_low": low, "ci_high": high})
    # MATH's subjects and levels: greedy accuracy per group, each with its own n and interval
    groups = accuracy_breakdown([p.meta for p in problems], scored.greedy_correct)
    for metric, (correct, n) in groups.items():
        low, high = wilson_interval(correct, n)
        sink.score({**provenance, "n": n, "metric": metric, "value": correct / n, "ci_low": low, "ci_high": high})
    sink.metrics(0, {f"eval/{k}": v for k, v in values.items()})
    low, high = intervals["accuracy"]
    sink.event(
        "scored",
        f"{bench.name}: accuracy {values['accuracy']:.1%} (95% CI {low:.1%}-{high:.1%}) on {len(problems)} problems",
        data=values,
    )
    return {**values, **{metric: correct / n for metric, (correct, n) in groups.items()}}
