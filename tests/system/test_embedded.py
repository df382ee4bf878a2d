"""The README's first command on the embedded default: SQLite, SQLite broker, a worker and
the API, no external services."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from mathrl.status import TERMINAL
from tests.helpers.env import ROOT, data_dir, die_with_parent

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1260)  # the run's own limit below, and a minute to report it
def test_embedded_demo_pipeline_runs_every_step_and_prints_the_gain(tmp_path: Path, figure: Any) -> None:
    """The README's first command, shortened (--quick: the full SFT and RM, 40 GRPO steps; the same
    pipeline file otherwise), and what it is for: the reward model ranks the policy's answers
    well above chance and better than majority vote, and GRPO improves held-out accuracy.
    With the fixed seeds this run gave pairwise 92.2%, best-of-8 78.2% vs maj-of-8 60.9%, and a
    GRPO gain of +22.0 points (62.7% -> 84.7%); the floors leave room for other CPUs' arithmetic."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATHRL_")}
    env["MATHRL_DATA_DIR"] = data_dir()
    out = subprocess.run(
        [sys.executable, "-m", "service.cli", "demo", "--home", str(tmp_path / "home"), "--quick", "--port", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        # 194 s alone on one thread here on 2026-12-07 (359 s before the RM's cuts and the integer grading),
        # 359 s beside the suite's other lane that day, and the machine is twice as slow on some days
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for step in ("sft", "eval-sft", "rm", "grpo", "eval-grpo"):
        assert f"{step} succeeded" in " ".join(out.stdout.split()), (step, out.stdout[-3000:])
    text = " ".join(out.stdout.split())
    assert "/ui/pipelines/" in text and "demo finished" in text
    gain = re.search(r"GRPO gain on arith: ([-+]\d+\.\d) points", text)
    assert gain and float(gain.group(1)) >= 8.0, text[-3000:]
    rm = dict(re.findall(r"(\w+_accuracy) (\d+\.\d)%", text.split("reward model (held-out):")[1]))
    assert float(rm["pairwise_accuracy"]) >= 75.0, rm
    figure(f"demo --quick: GRPO gain {gain.group(1)} points; reward model {rm}")
    assert float(rm["best_of_8_accuracy"]) > float(rm["maj_at_8_accuracy"]), rm


def test_embedded_eval_demo_runs_an_eval_job_through_the_service(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATHRL_")}
    env["MATHRL_DATA_DIR"] = data_dir()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "demo",
            "--home",
            str(tmp_path / "home"),
            "--eval-model",
            "tiny",
            "--limit",
            "3",
            "--max-new-tokens",
            "8",
            "--port",
            "0",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "submitted eval job" in out.stdout and "succeeded" in out.stdout
    assert "accuracy" in out.stdout and "demo finished" in out.stdout
    # no terminal here: it ends, saying the one command that brings its pages back (issue 66.7)
    assert f"`scripts/demo --serve --home {tmp_path / 'home'}` brings them back" in " ".join(out.stdout.split())
    assert (tmp_path / "home" / "mathrl.db").exists() and (tmp_path / "home" / "broker.db").exists()


def _like_a_terminal() -> None:
    """A Popen preexec_fn: Ctrl-C and a closed terminal act on the demo as in a shell, even under a
    runner that ignores them; and the demo dies with the test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python then installs its KeyboardInterrupt handler
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    die_with_parent()


def test_demo_run_again_after_an_interrupted_run_cancels_or_picks_it_up(tmp_path: Path) -> None:
    """Issue 44: run again after an interrupted run, the demo sat behind the old pipeline (the
    worker resumed it first) until it was cancelled by hand. Now a run finds the earlier run's
    pipeline: of another spec it is cancelled, of the same spec it is picked up, and the demo says
    which; never a second pipeline behind the first. Three real demo processes on one home: a
    long pipeline whose terminal is closed (SIGHUP), a short one in its place that is stopped
    with Ctrl-C (SIGINT), and that short one run again to its end."""
    from store.db import session_scope
    from store.models import Job, Pipeline
    from store.pipelines import pipeline_status
    from tests.helpers.jobs import eval_step, sft_step

    home = tmp_path / "home"
    long_file, short_file = tmp_path / "long.yaml", tmp_path / "short.yaml"
    long_file.write_text(json.dumps({"name": "long", "jobs": {"train": sft_step(steps=100000, save_steps=100000)}}))
    short_file.write_text(
        json.dumps({"name": "short", "jobs": {"train": sft_step(steps=20), "after": eval_step("job:train")}})
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATHRL_")}
    env.update(MATHRL_DATA_DIR=data_dir(), PYTHONUNBUFFERED="1", COLUMNS="250")
    procs: list[subprocess.Popen[bytes]] = []

    def demo(pipeline: Path, log: str) -> tuple[subprocess.Popen[bytes], Path]:
        out = tmp_path / log
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "service.cli", "demo", "--home", str(home), "--pipeline", str(pipeline)]
                + ["--port", "0"],
                cwd=ROOT,
                env=env,
                stdout=out.open("wb"),
                stderr=subprocess.STDOUT,
                preexec_fn=_like_a_terminal,
            )
        )
        return procs[-1], out

    def said(out: Path) -> str:
        return " ".join(out.read_text().split())

    def submitted(proc: subprocess.Popen[bytes], out: Path) -> str:
        deadline = time.monotonic() + 180
        while not (m := re.search(r"submitted pipeline (\S+):", said(out))):
            assert proc.poll() is None and time.monotonic() < deadline, said(out)[-3000:]
            time.sleep(0.3)
        return m.group(1)

    def pipelines() -> dict[str, tuple[str | None, str]]:
        with session_scope(f"sqlite:///{home / 'mathrl.db'}") as s:
            jobs = s.scalars(select(Job).where(Job.pipeline_id.is_not(None))).all()
            return {
                p.id: (p.name, pipeline_status(j.status for j in jobs if j.pipeline_id == p.id))
                for p in s.scalars(select(Pipeline))
            }

    try:
        proc, out = demo(long_file, "1.out")  # the terminal is closed while the long pipeline runs
        long_id = submitted(proc, out)
        proc.send_signal(signal.SIGHUP)
        proc.wait(timeout=60)
        assert pipelines()[long_id][1] not in TERMINAL

        proc, out = demo(short_file, "2.out")  # another pipeline file: the long one is cancelled first
        short_id = submitted(proc, out)
        assert f"cancelled pipeline {long_id} from an earlier run: a different spec" in said(out), said(out)[-3000:]
        proc.send_signal(signal.SIGINT)  # Ctrl-C before it ends
        proc.wait(timeout=60)
        assert pipelines()[short_id][1] not in TERMINAL

        proc, out = demo(short_file, "3.out")  # the same file again: picked up, not submitted again
        assert proc.wait(timeout=400) == 0, said(out)[-3000:]
        text = said(out)
        assert f"resumed pipeline {short_id} from an earlier run" in text and "submitted pipeline" not in text, text
        assert "train succeeded" in text and "after succeeded" in text and "demo finished" in text, text[-3000:]
        assert pipelines() == {long_id: ("long", "cancelled"), short_id: ("short", "succeeded")}
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)  # its finally stops its API and worker
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
