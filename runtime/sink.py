"""The sink: how a trainer or evaluator reports what happens, without knowing where it goes.

The worker passes a sink that writes to the database; `mathrl-server eval` run locally passes one
that prints. Trainer and evaluator depend only on this protocol.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Protocol


class Sink(Protocol):
    def event(self, type: str, message: str = "", level: str = "info", data: dict[str, Any] | None = None) -> None:
        """A line in the job's event log."""

    def progress(self, done: int, total: int, message: str = "") -> None:
        """Progress of the current phase (throttled by the sink)."""

    def stored_steps(self) -> set[int]:
        """The steps the job has samples of already (an earlier attempt's): a batch resumed after a
        drain or a pause goes on after them."""

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """Scalar metrics at a step. Writing the same (name, step) twice keeps the first."""

    def samples(self, step: int | None, items: list[dict[str, Any]]) -> None:
        """Completions: each item has 'prompt', 'completion' and optional 'data'."""

    def checkpoint(
        self,
        step: int,
        uri: str,
        kind: str = "checkpoint",
        data: dict[str, Any] | None = None,
        source: str | None = None,
    ) -> None:
        """A saved checkpoint or artifact, which lives at `uri` from now on. `source`: where the
        process wrote it, if elsewhere (a job attempt's own directory): the sink moves it to
        `uri`, and the worker's sink does so only while the attempt still owns the job."""

    def score(self, record: dict[str, Any]) -> None:
        """A benchmark score with its provenance (see store.models.BenchmarkScore)."""

    def should_stop(self, fresh: bool = False) -> bool:
        """True when the job was asked to stop; checked between steps. `fresh`: ask the store now
        (at a step's end, so that no step starts after a cancel or pause was accepted), not only
        every so often (the generation loops call it far more often)."""

    def endpoint(self, url: str | None, token: str = "") -> None:
        """Where this job serves its client's calls (a session job), or None: it serves no more."""

    def draining(self) -> bool:
        """True when the stop is a drain (the worker is shutting down): a trainer saves a
        checkpoint at this step before it stops, and the job resumes from it elsewhere."""


def promote(source: Path, target: Path) -> None:
    """Move a finished checkpoint (or result file) from where a process wrote it to its place,
    replacing what a replayed step left there: the old one is renamed aside first, so a crash
    mid-way leaves either the old or the new one under the name, never half of one."""
    if not source.exists() and target.exists():
        return  # moved already (a retried transaction whose first commit's answer was lost)
    target.parent.mkdir(parents=True, exist_ok=True)
    old = target.with_name(f".{target.name}.replaced")
    _remove(old)
    if target.exists():
        os.rename(target, old)
    os.rename(source, target)
    _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class PrintSink:
    """For local runs with no service: events and scores go to the terminal via rich."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        self.scores: list[dict[str, Any]] = []
        self.items: list[dict[str, Any]] = []

    def event(self, type: str, message: str = "", level: str = "info", data: dict[str, Any] | None = None) -> None:
        self.console.print(f"[dim]{type}[/dim] {message}")

    def progress(self, done: int, total: int, message: str = "") -> None:
        self.console.print(f"[dim]progress[/dim] {done}/{total} {message}")

    def metrics(self, step: int, values: dict[str, float]) -> None:
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(values.items()))
        self.console.print(f"[dim]step {step}[/dim] {shown}")

    def samples(self, step: int | None, items: list[dict[str, Any]]) -> None:
        self.items.extend(items)

    def stored_steps(self) -> set[int]:
        return set()  # a local run starts afresh

    def checkpoint(
        self,
        step: int,
        uri: str,
        kind: str = "checkpoint",
        data: dict[str, Any] | None = None,
        source: str | None = None,
    ) -> None:
        if source is not None and source != uri:
            promote(Path(source), Path(uri))
        self.console.print(f"[dim]{kind}[/dim] step {step}: {uri}")

    def score(self, record: dict[str, Any]) -> None:
        self.scores.append(record)

    def endpoint(self, url: str | None, token: str = "") -> None:
        self.console.print(f"[dim]endpoint[/dim] {url or 'closed'}")

    def should_stop(self, fresh: bool = False) -> bool:
        return False

    def draining(self) -> bool:
        return False
