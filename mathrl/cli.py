"""`mathrl`: the command line for the service (typer + rich).

    mathrl jobs submit spec.yaml --follow
    mathrl jobs list --status running
    mathrl jobs logs <id> --follow
    mathrl jobs results <id> -o items.jsonl
    mathrl pipeline submit pipeline.yaml --wait
    mathrl scores --benchmark gsm8k
    mathrl keys create --name laptop

The server and key come from --url/--api-key or MATHRL_URL/MATHRL_API_KEY.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer
import yaml
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from mathrl.client import Client, MathRLError
from mathrl.schemas import TERMINAL_STATUSES, JobResponse, PipelineResponse


class _Commands(TyperGroup):
    """The one place the CLI turns a service error (problem details) into its message and exit
    code 1, for every command: commands just call the client."""

    def invoke(self, ctx: Any) -> Any:  # typer's own vendored click.Context
        try:
            return super().invoke(ctx)
        except MathRLError as exc:
            _fail(exc)
        except httpx.HTTPError as exc:  # no answer at all: down, a wrong address, a URL without its scheme
            where = str(exc.request.url) if _has_request(exc) else "the service"
            err.print(
                f"[red]cannot reach {where}[/red]: {type(exc).__name__}: {exc or 'no answer'}. Check --url or "
                "MATHRL_URL (e.g. http://localhost:8000) and that the service is running."
            )
            raise typer.Exit(1) from None


def _has_request(exc: httpx.HTTPError) -> bool:
    try:
        exc.request  # noqa: B018 (unset on errors raised before a request was built)
    except RuntimeError:
        return False
    return True


app = typer.Typer(
    cls=_Commands, no_args_is_help=True, add_completion=False, help="Train and evaluate math LLMs with mathrl."
)
jobs_app = typer.Typer(no_args_is_help=True, help="Submit and watch jobs.")
keys_app = typer.Typer(no_args_is_help=True, help="API keys.")
pipeline_app = typer.Typer(no_args_is_help=True, help="Several jobs in one submission, run in dependency order.")
app.add_typer(jobs_app, name="jobs")
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(keys_app, name="keys")

console = Console()
err = Console(stderr=True)

UrlOpt = Annotated[str | None, typer.Option("--url", envvar="MATHRL_URL", help="Service URL")]
KeyOpt = Annotated[str | None, typer.Option("--api-key", envvar="MATHRL_API_KEY", help="API key")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")]


def _client(url: str | None, key: str | None) -> Client:
    return Client(url, api_key=key)


def _fail(exc: MathRLError) -> NoReturn:
    err.print(f"[red]{exc.status} {exc.title}[/red]: {exc.detail}")
    for e in exc.errors:
        err.print(f"  [bold]{e.get('pointer', '')}[/bold]: {e.get('detail', '')}")
    raise typer.Exit(1)


def _print_jobs(jobs: list[JobResponse]) -> None:
    table = Table()
    for col in ("id", "kind", "status", "name", "queue", "attempts", "created"):
        table.add_column(col)
    for j in jobs:
        c = _COLORS.get(j.status, "white")
        table.add_row(
            j.id,
            j.kind,
            f"[{c}]{j.status}[/{c}]",
            j.name or "",
            j.queue,
            str(j.attempts),
            f"{j.created_at:%Y-%m-%d %H:%M:%S}",
        )
    console.print(table)


def load_spec_file(path: Path) -> dict[str, Any]:
    """YAML or JSON; YAML is loaded with the safe loader (no Python objects)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:  # a UTF-16 file (PowerShell's `>` writes one), a folder, no access
        raise typer.BadParameter(f"{path} cannot be read as UTF-8 text: {exc}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=_SpecLoader)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:  # a python/object tag is a YAMLError here
        raise typer.BadParameter(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from exc
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{path} must hold one mapping (a job spec), not {type(data).__name__}")
    if (where := _not_json(data)) is not None:  # .nan, .inf, or a binary: the request would not encode
        raise typer.BadParameter(f"{path}: {where} is not a value JSON can carry (a number, a string, ...)")
    return data


class _SpecLoader(yaml.SafeLoader):
    """YAML's safe loader without its date rule: `name: 2024-06-01` is that text, not a date that the
    request cannot carry (it was a traceback)."""


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in rules if tag != "tag:yaml.org,2002:timestamp"]
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _not_json(value: Any, where: str = "") -> str | None:
    """The first place in `value` that JSON cannot carry, as 'key.key[0]', else None."""
    if isinstance(value, dict):
        for k, v in value.items():
            if (bad := _not_json(v, f"{where}.{k}" if where else str(k))) is not None:
                return bad
        return None
    if isinstance(value, list):
        return next((bad for i, v in enumerate(value) if (bad := _not_json(v, f"{where}[{i}]")) is not None), None)
    if isinstance(value, float) and not math.isfinite(value):
        return where or "the spec"
    if value is None or isinstance(value, (str, int, float, bool)):
        return None
    return where or "the spec"


_COLORS = {
    "succeeded": "green",
    "failed": "red",
    "cancelled": "yellow",
    "running": "cyan",
    "paused": "magenta",
    "waiting": "dim",
}


def _print_pipeline(p: PipelineResponse) -> None:
    c = _COLORS.get(p.status, "white")
    console.print(f"pipeline [bold]{p.id}[/bold] {p.name or ''} [{c}]{p.status}[/{c}]")
    table = Table(box=None)
    for col in ("step", "kind", "status", "job", "after", "error"):
        table.add_column(col)
    for j in p.jobs:
        c = _COLORS.get(j.status, "white")
        table.add_row(j.step, j.kind, f"[{c}]{j.status}[/{c}]", j.job_id, ", ".join(j.depends_on), j.error or "")
    console.print(table)


@pipeline_app.command("submit")
def pipeline_submit(
    spec_file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Pipeline spec (YAML or JSON)")],
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    wait: Annotated[bool, typer.Option("--wait", "-w", help="Show progress until every job has ended")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Submit a pipeline: `jobs:` maps step names to job specs; 'job:<step>' names a step's output."""
    with _client(url, api_key) as c:
        p = c.pipelines.create(load_spec_file(spec_file))
        if as_json:
            console.print_json(p.model_dump_json())
        else:
            _print_pipeline(p)
        if wait:
            last = None
            while p.status not in TERMINAL_STATUSES:
                time.sleep(2.0)
                p = c.pipelines.retrieve(p.id)
                now = [(j.step, j.status) for j in p.jobs]
                if now != last:
                    console.print(" ".join(f"{s}:{st}" for s, st in now))
                    last = now
            _print_pipeline(p)
    if wait and p.status != "succeeded":
        raise typer.Exit(1)


@pipeline_app.command("list")
def pipeline_list(
    url: UrlOpt = None, api_key: KeyOpt = None, limit: Annotated[int, typer.Option(help="Show at most this many")] = 20
) -> None:
    """List pipelines, newest first."""
    with _client(url, api_key) as c:
        for i, p in enumerate(c.pipelines.list(page_size=min(limit, 200))):
            if i >= limit:
                break
            _print_pipeline(p)


@pipeline_app.command("get")
def pipeline_get(pipeline_id: str, url: UrlOpt = None, api_key: KeyOpt = None, as_json: JsonOpt = False) -> None:
    """Show a pipeline and each of its jobs."""
    with _client(url, api_key) as c:
        p = c.pipelines.retrieve(pipeline_id)
    console.print_json(p.model_dump_json()) if as_json else _print_pipeline(p)


@pipeline_app.command("cancel")
def pipeline_cancel(pipeline_id: str, url: UrlOpt = None, api_key: KeyOpt = None) -> None:
    """Cancel every job of the pipeline that has not ended."""
    with _client(url, api_key) as c:
        _print_pipeline(c.pipelines.cancel(pipeline_id))


@jobs_app.command("submit")
def submit(
    spec_file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Job spec (YAML or JSON)")],
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Resubmitting with the same key returns the same job")
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream the job's events until it ends")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job spec."""
    with _client(url, api_key) as c:
        job = c.jobs.create(load_spec_file(spec_file), idempotency_key=idempotency_key)
        if as_json:
            console.print_json(job.model_dump_json())
        else:
            console.print(f"submitted [bold]{job.id}[/bold] ({job.kind}, {job.status}, queue {job.queue})")
        if follow:
            _follow(c, job.id)


def _follow(c: Client, job_id: str) -> None:
    for ev in c.jobs.follow(job_id):
        style = {"error": "red", "warning": "yellow"}.get(ev.level, "")
        line = f"[dim]{ev.time:%H:%M:%S}[/dim] {ev.type}: {ev.message}"
        console.print(f"[{style}]{line}[/{style}]" if style else line)
    job = c.jobs.retrieve(job_id)
    console.print(f"job {job.id}: [bold]{job.status}[/bold]" + (f" ({job.error})" if job.error else ""))
    if job.status != "succeeded":
        raise typer.Exit(1)


@jobs_app.command("list")
def list_jobs(
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    kind: str | None = None,
    status: str | None = None,
    tag: str | None = None,
    limit: Annotated[int, typer.Option(help="Show at most this many")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """List jobs, newest first."""
    with _client(url, api_key) as c:
        jobs = []
        for j in c.jobs.list(kind=kind, status=status, tag=tag, page_size=min(limit, 500)):
            jobs.append(j)
            if len(jobs) >= limit:
                break
    if as_json:
        console.print_json(json.dumps([j.model_dump(mode="json") for j in jobs]))
    else:
        _print_jobs(jobs)


@jobs_app.command("get")
def get(job_id: str, url: UrlOpt = None, api_key: KeyOpt = None) -> None:
    """Show one job, its resolved config included."""
    with _client(url, api_key) as c:
        console.print_json(c.jobs.retrieve(job_id).model_dump_json())


@jobs_app.command("cancel")
def cancel(job_id: str, url: UrlOpt = None, api_key: KeyOpt = None) -> None:
    """Cancel a queued or running job."""
    with _client(url, api_key) as c:
        job = c.jobs.cancel(job_id)
    console.print(f"{job.id}: {job.status}" + (" (stopping)" if job.status == "running" else ""))


@jobs_app.command("logs")
def logs(
    job_id: str,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming until the job ends")] = False,
) -> None:
    """Print a job's event log."""
    with _client(url, api_key) as c:
        if follow:
            _follow(c, job_id)
            return
        for ev in c.jobs.events(job_id):
            console.print(f"[dim]{ev.time:%H:%M:%S}[/dim] {ev.type}: {ev.message}")


@jobs_app.command("metrics")
def metrics(job_id: str, url: UrlOpt = None, api_key: KeyOpt = None, name: str | None = None) -> None:
    """Latest value and length of each metric series."""
    with _client(url, api_key) as c:
        series = c.jobs.metrics(job_id, name=name)
    table = Table()
    for col in ("metric", "points", "last step", "last value"):
        table.add_column(col)
    for s in series:
        last = s.points[-1]
        table.add_row(s.name, str(len(s.points)), str(last.step), f"{last.value:.6g}")
    console.print(table)


@jobs_app.command("results")
def results(
    job_id: str,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout")] = None,
) -> None:
    """An eval job's per-item results as JSON lines (prompt, completion, gold, extracted answer, verdict)."""
    with _client(url, api_key) as c:
        items = c.jobs.results(job_id)
    text = "".join(json.dumps(item) + "\n" for item in items)
    if output is None:
        sys.stdout.write(text)
        return
    output.write_text(text)
    correct = sum(bool((i.get("data") or {}).get("correct")) for i in items)
    err.print(f"{len(items)} items ({correct} correct) -> {output}")


@app.command("scores")
def scores(
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    model: str | None = None,
    benchmark: str | None = None,
    job: str | None = None,
    as_json: JsonOpt = False,
) -> None:
    """Benchmark scores with their provenance."""
    with _client(url, api_key) as c:
        rows = c.scores.list(model=model, benchmark=benchmark, job_id=job)
    if as_json:
        console.print_json(json.dumps([r.model_dump(mode="json") for r in rows]))
        return
    table = Table()
    for col in ("benchmark", "model", "metric", "value", "95% CI", "n", "backend", "job"):
        table.add_column(col)
    for r in rows:
        ci = f"{r.ci_low:.3f}-{r.ci_high:.3f}" if r.ci_low is not None and r.ci_high is not None else ""
        table.add_row(
            f"{r.benchmark} v{r.benchmark_version}",
            r.model_ref,
            r.metric,
            f"{r.value:.4g}",
            ci,
            str(r.n),
            r.backend,
            r.job_id,
        )
    console.print(table)


@keys_app.command("create")
def keys_create(
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    name: str | None = None,
    project: Annotated[str | None, typer.Option(help="Another project: needs --admin-token")] = None,
    admin_token: Annotated[str | None, typer.Option(envvar="MATHRL_ADMIN_TOKEN", help="Operator token")] = None,
    expires_in_days: Annotated[int | None, typer.Option(help="Default: the server's (90 days)")] = None,
    scope: Annotated[
        list[str] | None, typer.Option(help="read, submit or keys; repeat for several (default: your key's own scopes)")
    ] = None,
) -> None:
    """Create an API key (printed once; only its hash is stored)."""
    with _client(url, api_key) as c:
        key = c.keys.create(
            name=name,
            project=project,
            expires_in_days=expires_in_days,
            admin_token=admin_token,
            scopes=scope or None,
        )
    err.print(f"key {key.id} for project '{key.project}' (shown once):")
    sys.stdout.write(key.key + "\n")


@keys_app.command("list")
def keys_list(url: UrlOpt = None, api_key: KeyOpt = None) -> None:
    """Your project's keys: prefix, scopes, expiry, whether revoked (never the secrets)."""
    with _client(url, api_key) as c:
        keys = c.keys.list()
    table = Table("id", "name", "prefix", "scopes", "expires", "revoked")
    for k in keys:
        table.add_row(
            k.id, k.name or "", k.prefix, ",".join(k.scopes), str(k.expires_at or "never"), str(k.revoked_at or "")
        )
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(key_id: str, url: UrlOpt = None, api_key: KeyOpt = None) -> None:
    """Revoke a key of your project."""
    with _client(url, api_key) as c:
        c.keys.revoke(key_id)
    console.print(f"revoked {key_id}")


if __name__ == "__main__":
    app()
