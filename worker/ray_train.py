"""What runs on the Ray cluster for a training job past one node (or in a pool the operator set
to run on Ray): the Ray job's entrypoint, `python -m worker.ray_train <job_id> <owner> <attempt>
<workers> <gpus_per_worker>`, submitted by worker.ray_submit through Ray's Jobs API.

It runs the job as Ray Train workers (ray.train.torch.TorchTrainer, one per GPU, or per CPU
process, spread over the nodes), each running the same code as a rank under `accelerate launch`
(worker.child.run_rank): Ray Train sets up the torch process group and RANK / WORLD_SIZE /
LOCAL_RANK / MASTER_ADDR, which accelerate and TRL pick up. Rank 0 writes metrics, samples,
events and checkpoints through the job's DatabaseSink; the other ranks only watch for stop
requests (ReadOnlySink).

How the ranks reach the store: directly. Every Ray node has MATHRL_DATABASE__URL in its own
environment (the chart gives the Ray pods the database secret, and a network policy must let
them reach the database), so the secret never travels in the Ray job's record, which anyone
with the Ray dashboard can read; the worker forwards the other MATHRL_* settings in the job's
runtime_env. Checkpoints and the final model go to MATHRL_ARTIFACT_DIR, which must be the same
shared filesystem (a ReadWriteMany volume) at the same path on the worker and every Ray node:
the next job and eval jobs read them from there.

The driver prints `mathrl-workers: {...}` once every rank has started (rank -> node, host, pid),
which the supervisor turns into an event (worker.ray_submit), and `mathrl-outcome: {...}` at the
end (each rank's exit code and error, for whoever reads the log). Its exit code is rank 0's
(worker.child's codes: 0 done, 2 stopped, 5 drained, ...), or 1 when rank 0 finished and
another rank failed or Ray Train itself failed.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any

WORKERS_LINE = "mathrl-workers: "
OUTCOME_LINE = "mathrl-outcome: "
DATABASE_ENV = "MATHRL_DATABASE__URL"


def _rank_info() -> dict[str, Any]:
    import ray

    return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(), "pid": os.getpid()}


def train_worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: a rank of the job (worker.child.run_rank), its code reported back."""
    import ray

    from service.settings import get_settings
    from worker.child import EXIT_ERROR, attempt_dir, run_rank
    from worker.launch import error_file, rank

    outcome = config["outcome"]
    me = rank()
    info = _rank_info()
    ray.get(outcome.put.remote(me, info))
    err = error_file(attempt_dir(get_settings().artifact_dir, config["job_id"], config["attempt"]))
    if DATABASE_ENV not in os.environ:  # (run_rank writes its own errors to the same file)
        err.parent.mkdir(parents=True, exist_ok=True)
        err.write_text(
            f"{DATABASE_ENV} is not set on Ray node {info['host']}: give the Ray cluster's pods the database "
            "secret (the chart's ray.* values do), so that the job's ranks can reach the store"
        )
        code = EXIT_ERROR
    else:
        code = run_rank(config["job_id"], config["owner"], config["attempt"])
    error = err.read_text().strip() if code and err.exists() else None
    ray.get(outcome.put.remote(me, {**info, "code": code, "error": error}))


def exit_code(ranks: dict[int, dict[str, Any]], world: int, failure: str | None) -> int:
    """The job's exit code: rank 0's when it failed or stopped; else 1 if any rank (or Ray Train)
    failed or did not report; else 0."""
    from worker.child import EXIT_ERROR, EXIT_OK

    main = ranks.get(0, {}).get("code")
    if main is not None and main != EXIT_OK:
        return int(main)
    if failure or len(ranks) < world or any(r.get("code") != EXIT_OK for r in ranks.values()):
        return EXIT_ERROR
    return EXIT_OK


def run(job_id: str, owner: str, attempt: int, workers: int, gpus_per_worker: int) -> int:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from service.settings import get_settings
    from worker.child import attempt_dir
    from worker.launch import read_error

    settings = get_settings()
    ray.init()

    @ray.remote(num_cpus=0)
    class Outcome:
        def __init__(self) -> None:
            self.ranks: dict[int, dict[str, Any]] = {}

        def put(self, rank: int, info: dict[str, Any]) -> None:
            self.ranks[rank] = {**self.ranks.get(rank, {}), **info}

        def get(self) -> dict[int, dict[str, Any]]:
            return self.ranks

    outcome = Outcome.remote()  # type: ignore[attr-defined]
    per_worker: dict[str, float] = {"CPU": settings.ray.cpus_per_worker}
    if gpus_per_worker:
        per_worker["GPU"] = gpus_per_worker
    out = attempt_dir(settings.artifact_dir, job_id, attempt)
    trainer = TorchTrainer(
        train_worker,
        train_loop_config={"job_id": job_id, "owner": owner, "attempt": attempt, "outcome": outcome},
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=gpus_per_worker > 0,
            resources_per_worker=per_worker,
            placement_strategy="SPREAD",  # across the nodes the job asked for
        ),
        run_config=RunConfig(
            name=f"mathrl-{job_id}-{attempt}",
            storage_path=str(out / "ray"),  # the shared artifact volume, like the job's checkpoints
            failure_config=FailureConfig(max_failures=0),  # a retry is a new attempt of the mathrl job
        ),
    )
    failure: list[str] = []

    def fit() -> None:
        try:
            trainer.fit()
        except Exception as exc:  # a worker died, placement failed: the job fails with it
            failure.append(f"{type(exc).__name__}: {exc}")

    fitting = threading.Thread(target=fit, name="mathrl-ray-fit", daemon=True)
    fitting.start()
    announced = False
    while fitting.is_alive():
        fitting.join(timeout=0.5)
        if not announced:
            ranks = ray.get(outcome.get.remote())
            if len(ranks) == workers:
                print(WORKERS_LINE + json.dumps({str(r): ranks[r] for r in sorted(ranks)}), flush=True)
                announced = True
    ranks = ray.get(outcome.get.remote())
    code = exit_code(ranks, workers, failure[0] if failure else None)
    errors = {str(r): i["error"] for r, i in sorted(ranks.items()) if i.get("error")}
    if failure:
        errors["ray"] = failure[0][-2000:]
    print(
        OUTCOME_LINE
        + json.dumps({"code": code, "ranks": {str(r): ranks[r].get("code") for r in ranks}, "errors": errors}),
        flush=True,
    )
    if failure and read_error(out) is None:  # the ranks' own errors are in their error files
        (out / "error.txt").write_text(f"Ray Train failed: {failure[0]}")
    return code


def main(argv: list[str]) -> int:
    job_id, owner, attempt, workers, gpus = argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5])
    t0 = time.monotonic()
    code = run(job_id, owner, attempt, workers, gpus)
    print(
        f"mathrl: Ray job of {job_id} attempt {attempt} ended with {code} after {time.monotonic() - t0:.1f}s",
        flush=True,
    )
    return code


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    os._exit(code)  # Ray's own threads would hold interpreter shutdown
