"""A real model learns through the service: a shortened examples/smollm2-arith.yaml (the
two-digit task only, fewer GRPO steps, fewer held-out problems) on SmolLM2-135M-Instruct with vLLM
generation, submitted as a pipeline to the real API and worker, evaluated before and after by eval
jobs with the same answer extraction. The gain must clear a floor (see FLOOR)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.helpers.env import ROOT
from tests.helpers.service import Service

EXAMPLE = ROOT / "examples" / "smollm2-arith.yaml"
# GRPO steps: on this 2-core CPU with the fixed seeds, 18.0% -> 64.0% (+46.0 points) after 8 steps,
# 56.0% (+38.0) after 6, 52.0% (+34.0) after 5, 46.0% (+28.0) after 3 (a run of that many steps each;
# the learning rate decays over the run); a step takes 21-43 s here alone on one thread (2026-12-07)
STEPS = 3
HELDOUT = 50  # one eval batch (the example's batch_size): a second, short batch cost as much as the first
# Points of held-out accuracy the shortened run must gain: 13 points under what 3 steps gave here,
# for other CPUs' arithmetic; a run that learns nothing gives 0 (the same greedy model twice) and
# fails it. Generation with stale weights: test_vllm.py's updated-weights tests.
# The full example's figures are in docs/benchmarks.md ("A real model learns through the service").
FLOOR = 15.0


def shortened(model: str) -> dict[str, Any]:
    spec = yaml.safe_load(EXAMPLE.read_text())
    jobs = {k: v for k, v in spec["jobs"].items() if k.endswith("-add2")}
    for job in jobs.values():
        if job["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct":
            job["model"] = model
        if job["kind"] == "eval":
            job["limit"] = HELDOUT
        else:
            job.update(max_steps=STEPS, save_steps=STEPS)
    return {**spec, "name": "shortened smollm2-arith", "jobs": jobs}


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the pipeline wait below: 136 s alone on one thread (2026-12-07), 2-3x that on a busy day
def test_smollm2_learns_two_digit_addition_through_the_service(service: Service, smollm2: str, figure: Any) -> None:
    c = service.client()
    p = c.pipelines.create(shortened(smollm2))
    done = c.pipelines.wait(p.id, timeout=1500)
    steps = {j.step: j for j in done.jobs}
    assert all(j.status == "succeeded" for j in done.jobs), {k: (j.status, j.error) for k, j in steps.items()}

    def accuracy(step: str) -> Any:
        return next(s for s in c.scores.list(job_id=steps[step].job_id) if s.metric == "accuracy")

    before, after = accuracy("eval-base-add2"), accuracy("eval-grpo-add2")
    assert before.n == after.n == HELDOUT
    gain = (after.value - before.value) * 100
    gen = next(e for e in c.jobs.events(steps["grpo-add2"].job_id) if e.type == "generation")
    assert gen.data["backend"] == "vllm", gen
    figure(f"smollm2 shortened example: {before.value:.1%} -> {after.value:.1%} ({gain:+.1f} points), n={HELDOUT}")
    assert gain >= FLOOR, f"{before.value:.1%} -> {after.value:.1%} ({gain:+.1f} points, floor {FLOOR})"


@pytest.mark.quick
def test_the_shortened_example_is_the_example() -> None:
    """The test above runs the example's own jobs, only shorter."""
    full = yaml.safe_load(EXAMPLE.read_text())["jobs"]
    short = shortened("/m")["jobs"]
    assert set(short) == {"eval-base-add2", "grpo-add2", "eval-grpo-add2"}
    for name, job in short.items():
        changed = {k for k in job if job[k] != full[name].get(k)}
        assert changed <= {"model", "limit", "max_steps", "save_steps"}, (name, changed)
