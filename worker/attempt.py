"""One attempt's directory, `<artifact dir>/jobs/<job id>/attempt-<N>`, and the files the worker
and the job's processes leave in it. Every file name is here: the supervisor, the job's ranks
and the Ray driver ask an `AttemptDir` for the path instead of spelling it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def job_dir(artifact_dir: str, job_id: str) -> Path:
    """What outlives the job's attempts: its checkpoints, final model and results."""
    return Path(artifact_dir).resolve() / "jobs" / job_id


def attempt_dir(artifact_dir: str, job_id: str, attempt: int) -> Path:
    return job_dir(artifact_dir, job_id) / f"attempt-{attempt}"


@dataclass(frozen=True)
class AttemptDir:
    path: Path

    @property
    def log(self) -> Path:
        """The job's processes' output (stdout and stderr of every rank)."""
        return self.path / "job.log"

    @property
    def error(self) -> Path:
        """The main rank's last error, or the supervisor's reason the attempt failed."""
        return self.path / "error.txt"

    def rank_error(self, rank: int) -> Path:
        """Rank `rank`'s last error (the main rank's is `error`)."""
        return self.error if rank == 0 else self.path / f"error-rank-{rank}.txt"

    @property
    def exit_code(self) -> Path:
        """The main rank's exit code (accelerate exits 1 whenever any rank fails)."""
        return self.path / "exit-code"

    @property
    def drain_request(self) -> Path:
        """Made by the supervisor to ask the job to checkpoint and stop (worker shutting down)."""
        return self.path / "drain-requested"

    @property
    def rejected_writes(self) -> Path:
        """A line per write the store refused (the attempt lost its lease)."""
        return self.path / "rejected-writes.log"

    def write_error(self, message: str) -> None:
        self.error.write_text(message)

    def read_error(self) -> str | None:
        """The attempt's error: the main rank's, else the first other rank's that wrote one."""
        if self.error.exists():
            return self.error.read_text().strip() or None
        for f in sorted(self.path.glob("error-rank-*.txt")):
            return f"rank {f.stem.rsplit('-', 1)[1]}: {f.read_text().strip()}"
        return None
