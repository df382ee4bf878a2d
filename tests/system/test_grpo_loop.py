"""mathrl's GRPO loop (trainer/grpo_loop.py) against the TRL trainer it wraps.

- Skipping zero-advantage completions leaves the update as it was: same seed, one step, plain
  SGD (so the weight change is the gradient itself; Adam's first step is about lr x sign(g) and
  would hide a wrongly scaled loss), on one process and on two, for each loss type that averages
  differently.
- Dynamic sampling drops groups without signal and refills the step, and says so in its metrics.
The runs are real GRPO steps on the tiny model (tests/helpers/grpo_loop_run.py); the reward gives half of
the questions a signal and the other half none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.env import ROOT, data_dir
from worker.launch import accelerate_cpu_launch

pytestmark = pytest.mark.slow

RUNNER = ROOT / "tests" / "helpers" / "grpo_loop_run.py"


def _run(model: str, out: Path, runs: list[dict[str, Any]], processes: int = 1) -> list[dict[str, Any]]:
    """Every run of `runs` (loop options) in one process start; their logged metrics, in order."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    launch = accelerate_cpu_launch(processes, 1) if processes > 1 else [sys.executable]
    args = [*launch, str(RUNNER), model, data_dir(), str(out), json.dumps(runs)]
    r = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return [json.loads((out / str(i) / "metrics.json").read_text()) for i in range(len(runs))]


def _deltas(model: str, out: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    start = load_file(str(Path(model) / "model.safetensors"))
    after = load_file(str(out / "weights.safetensors"))
    return {k: after[k] - start[k] for k in start}


LOSSES = ["dapo", "grpo", "bnpo", "dr_grpo"]


@pytest.fixture(scope="module")
def one_process(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """Plain and skipping runs of each loss type, and a dynamic-sampling run, in one process."""
    out = tmp_path_factory.mktemp("loop1")
    runs = [{"loss_type": t, "skip_zero_advantage": skip} for t in LOSSES for skip in (False, True)]
    runs.append({"steps": 2, "skip_zero_advantage": True, "dynamic_sampling": {"metric": "reward", "max_rounds": 3}})
    return out, _run(tiny_model, out, runs)


def _compare(model: str, plain: Path, skip: Path, what: str) -> None:
    import torch

    a, b = _deltas(model, plain), _deltas(model, skip)
    biggest = max(float(v.abs().max()) for v in a.values())
    assert biggest > 1e-3, "the step did not move the weights: nothing is compared"
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-6 * biggest, msg=lambda m, k=k: f"{k}: {m}")
    print(f"{what}: largest weight change {biggest:.3g}, equal with the skip")


def _skipped_some(plain: dict[str, Any], skip: dict[str, Any]) -> None:
    assert skip["skip_applies"]
    step = skip["logged"][0]
    # the step had groups without signal, and their completions were not trained on
    assert 0 < step["frac_reward_zero_std"] < 1, step
    assert step["skip/trained_fraction"] < 1, step
    assert "skip/trained_fraction" not in plain["logged"][0]


@pytest.mark.parametrize("loss_type", LOSSES)
def test_skipping_zero_advantage_completions_leaves_the_update_unchanged(
    loss_type: str, tiny_model: str, one_process: tuple[Path, list[dict[str, Any]]]
) -> None:
    out, results = one_process
    i = 2 * LOSSES.index(loss_type)
    _skipped_some(results[i], results[i + 1])
    _compare(tiny_model, out / str(i), out / str(i + 1), f"{loss_type} on one process")


def test_the_skip_leaves_the_update_unchanged_on_two_processes(tiny_model: str, tmp_path: Path) -> None:
    # the same 16 completions per step (2 micro-batches of 4 on each process)
    runs = [{"loss_type": "grpo", "per_device": 4, "skip_zero_advantage": skip} for skip in (False, True)]
    plain, skip = _run(tiny_model, tmp_path, runs, processes=2)
    _skipped_some(plain, skip)
    _compare(tiny_model, tmp_path / "0", tmp_path / "1", "grpo on two processes")


def test_dynamic_sampling_refills_the_step_with_informative_groups(
    one_process: tuple[Path, list[dict[str, Any]]],
) -> None:
    run = one_process[1][-1]
    steps = [m for m in run["logged"] if "loss" in m]
    assert len(steps) == 2
    for m in steps:
        # 4 groups asked for; rounds went on while groups came back without signal
        assert m["dynamic_sampling/rounds"] > 1, m
        assert m["dynamic_sampling/generated_completions"] > 16, m
        assert 0 < m["dynamic_sampling/zero_variance_fraction"] < 1, m
        # what was kept had more signal than what was generated
        assert m["skip/trained_fraction"] > 1 - m["dynamic_sampling/zero_variance_fraction"], m
        assert 0 < m["dynamic_sampling/kept_fraction"] <= 1, m


def test_overlap_trains_each_batch_one_step_later_against_the_samplers_logprobs(
    tiny_model: str, tmp_path: Path
) -> None:
    # 8 questions, 4 a step: an epoch is 2 steps, so the run crosses an epoch's end, where nothing
    # was read ahead (that step generates on the spot). Temperature 0.7: the sampler's
    # log-probabilities must be scaled as the trainer's are.
    common = {"steps": 4, "limit": 8, "temperature": 0.7, "record": True, "loss_type": "grpo"}
    plain, overlap, again = _run(tiny_model, tmp_path, [common, *[{**common, "overlap": True}] * 2])
    gens = overlap["generations"]
    assert [g["staleness"] for g in gens] == [0, 1, 0, 1], gens
    # the same questions each step as without overlap: reading ahead leaves the data's order
    assert [g["prompts"] for g in gens] == [g["prompts"] for g in plain["generations"]]
    for g in gens:
        # the old policy of the PPO ratio is the one that sampled: the weights `staleness` steps back
        assert g["error"] is not None and g["error"] < 1e-4, g
    for g in gens[1::2]:  # one step stale: the policy has moved since, and the ratio sees it
        assert g["drift"] > 100 * max(g["error"], 1e-6), g
    steps = [m for m in overlap["logged"] if "loss" in m]
    assert len(steps) == 4 and all(m["overlap/wait_seconds"] >= 0 for m in steps), steps
    assert all("old_per_token_logps" not in str(g) and g["error"] is None for g in plain["generations"])
    # the same seed gives the same run (the thread starts sampling from the global RNG only after
    # TRL's shuffle has drawn from it; started before the scoring, the runs here were equal too:
    # the thread's prefill outlasts the scoring and shuffle, so this does not catch that order)
    import torch

    first, second = _deltas(tiny_model, tmp_path / "1"), _deltas(tiny_model, tmp_path / "2")
    assert max(float(v.abs().max()) for v in first.values()) > 1e-3
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_overlap_on_two_processes(tiny_model: str, tmp_path: Path) -> None:
    # each rank reads its own shard ahead and generates on its own copy; nothing collective runs in
    # the thread, so the ranks' steps stay in lockstep
    run = {"steps": 2, "limit": 16, "record": True, "loss_type": "grpo", "per_device": 4, "overlap": True}
    (result,) = _run(tiny_model, tmp_path, [run], processes=2)
    gens = result["generations"]
    assert [g["staleness"] for g in gens] == [0, 1], gens
    assert all(g["error"] is not None and g["error"] < 1e-4 for g in gens), gens
    assert gens[1]["drift"] > 100 * max(gens[1]["error"], 1e-6), gens
