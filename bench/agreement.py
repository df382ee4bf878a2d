"""Do the two generation backends give the same scores? Runs `mathrl-server eval` (local, no service)
with the HF backend and the vLLM backend (both in .venv) on the same model, benchmarks,
prompts and greedy settings, one after the other, and prints greedy pass@1 for each with the
difference, how many completions are identical, and how many verdicts agree.

Issue 3's check: SmolLM2-135M-Instruct, first 200 GSM8K test + first 100 MATH-500, within 2 points.

    .venv/bin/python bench/agreement.py --model .mathrl/models/SmolLM2-135M-Instruct
    .venv/bin/python bench/agreement.py --model PATH --set gsm8k:20 --max-new-tokens 128   # quicker

The SmolLM2 directory is made once by `cache_smollm2` (evaluator/models.py); `scripts/demo
--eval-model smollm2` also makes it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PYTHONS = {"hf": ROOT / ".venv" / "bin" / "python", "vllm": ROOT / ".venv" / "bin" / "python"}


def run_eval(
    backend: str, model: str, benchmark: str, limit: int, max_new_tokens: int, batch_size: int, data_dir: str, out: Path
) -> tuple[list[dict], float]:
    cmd = [
        str(PYTHONS[backend]),
        "-m",
        "service.cli",
        "eval",
        "--model",
        model,
        "--benchmark",
        benchmark,
        "--limit",
        str(limit),
        "--backend",
        backend,
        "--max-new-tokens",
        str(max_new_tokens),
        "--batch-size",
        str(batch_size),
        "--data-dir",
        data_dir,
        "--out",
        str(out),
    ]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{backend} on {benchmark} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    items = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    return [i for i in items if i["data"]["sample"] == 0], seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument(
        "--set",
        action="append",
        dest="sets",
        metavar="BENCHMARK:LIMIT",
        help="repeatable; default gsm8k:200 and math500:100",
    )
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=16, help="HF batch size (vLLM schedules itself)")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default=None, help="keep per-item results here (default: a temp dir)")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]
    import tempfile

    from evaluator.metrics import wilson_interval
    from mathrl.paths import default_data_dir

    for python in PYTHONS.values():
        if not python.exists():
            sys.exit(f"{python} missing: run scripts/setup")
    data_dir = args.data_dir or default_data_dir()
    model = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model  # a path, or a hub id
    out_root = Path(args.out or tempfile.mkdtemp(prefix="mathrl-agreement-"))
    sets = [(s.split(":")[0], int(s.split(":")[1])) for s in (args.sets or ["gsm8k:200", "math500:100"])]
    print(
        f"backend agreement: {Path(args.model).name}, greedy, max {args.max_new_tokens} new tokens; "
        f"per-item results under {out_root}"
    )
    worst = 0.0
    for benchmark, limit in sets:
        runs = {}
        for backend in PYTHONS:
            items, seconds = run_eval(
                backend,
                model,
                benchmark,
                limit,
                args.max_new_tokens,
                args.batch_size,
                data_dir,
                out_root / f"{benchmark}-{backend}",
            )
            correct = sum(i["data"]["correct"] for i in items)
            low, high = wilson_interval(correct, len(items))
            truncated = sum(i["data"]["truncated"] for i in items) / len(items)
            runs[backend] = items
            print(
                f"  {benchmark:<8} {backend:<4}: pass@1 {100 * correct / len(items):5.1f}% "
                f"({correct}/{len(items)}, 95% CI {100 * low:.1f}-{100 * high:.1f}), "
                f"truncated {100 * truncated:.0f}%, {seconds:.0f}s wall incl. start-up"
            )
        hf, vl = runs["hf"], runs["vllm"]
        assert [i["prompt"] for i in hf] == [i["prompt"] for i in vl], "the backends saw different prompts"
        diff = 100 * (sum(i["data"]["correct"] for i in vl) - sum(i["data"]["correct"] for i in hf)) / len(hf)
        worst = max(worst, abs(diff))
        same_text = sum(a["completion"] == b["completion"] for a, b in zip(hf, vl, strict=True))
        same_verdict = sum(a["data"]["correct"] == b["data"]["correct"] for a, b in zip(hf, vl, strict=True))
        print(
            f"  {benchmark:<8} vLLM - HF: {diff:+.1f} points; identical completions {same_text}/{len(hf)}, "
            f"same verdict {same_verdict}/{len(hf)}"
        )
    print(f"largest pass@1 difference: {worst:.1f} points (target <= 2)")


if __name__ == "__main__":
    main()
