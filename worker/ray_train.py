"""What runs on the Ray cluster for a training job past one node (or in a pool the operator set
to run on Ray): the Ray job's entrypoint, `python -m worker.ray_train <job_id> <owner> <attempt>
<workers> <gpus_per_worker> [--vllm-server]`, submitted by worker.ray_submit through Ray's Jobs API.

`run` runs the job as Ray Train workers (ray.train.torch.TorchTrainer, `train_worker`), each a rank
as under `accelerate launch` (worker.child.run_rank): rank 0 writes through the job's DatabaseSink,
the others only watch for stop requests (ReadOnlySink). With `--vllm-server` it starts the job's
vLLM server first (worker.ray_vllm). The driver prints WORKERS_LINE and OUTCOME_LINE and exits
with `exit_code`. How the ranks reach the store and the artifacts, the server, and the exit codes:
docs/how-jobs-run.md, "`worker/ray_train.py`: the Ray job's driver".
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any

from config.settings import Settings
from mathrl.specs import GRPOSpec
from mathrl.specs.resolved import ResolvedGRPO
from worker.attempt import AttemptDir

WORKERS_LINE = "mathrl-workers: "
OUTCOME_LINE = "mathrl-outcome: "
DATABASE_ENV = "MATHRL_DATABASE__URL"


def _rank_info() -> dict[str, Any]:
    import ray

    return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(), "pid": os.getpid()}


def train_worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: a rank of the job (worker.child.run_rank), its code reported back."""
    import ray

    from config.settings import get_settings
    from worker.attempt import attempt_dir
    from worker.child import EXIT_ERROR, run_rank
    from worker.launch import error_file, rank
    from worker.vllm_server import URL_ENV

    if config.get("server_url"):  # the job's vLLM server, wherever Ray placed it (worker.ray_vllm)
        os.environ[URL_ENV] = config["server_url"]
    outcome = config["outcome"]
    me = rank()
    info = _rank_info()
    ray.get(outcome.put.remote(me, info))
    err = error_file(attempt_dir(get_settings().artifact_dir, config["job_id"], config["attempt"]))
    if DATABASE_ENV not in os.environ:  # (run_rank writes its own errors to the same file)
        err.parent.mkdir(parents=True, exist_ok=True)
        err.write_text(no_database(info["host"]))
        code = EXIT_ERROR
    else:
        code = run_rank(config["job_id"], config["owner"], config["attempt"])
    error = err.read_text().strip() if code and err.exists() else None
    ray.get(outcome.put.remote(me, {**info, "code": code, "error": error}))


def no_database(host: str) -> str:
    return (
        f"{DATABASE_ENV} is not set on Ray node {host}: give the Ray cluster's pods the database "
        "secret (the chart's ray.* values do), so that the job's ranks can reach the store"
    )


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


def run(job_id: str, owner: str, attempt: int, workers: int, gpus_per_worker: int, with_server: bool) -> int:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from config.settings import get_settings
    from worker import hub_access
    from worker.attempt import attempt_dir
    from worker.child import EXIT_ERROR

    settings = get_settings()
    hub_access.install(settings.sources.hub_token_repos)  # the driver resolves the server's model
    ray.init()
    out = attempt_dir(settings.artifact_dir, job_id, attempt)
    server: Any = None
    server_url = None
    if with_server:
        try:
            server = _start_server(settings, job_id, out)
        except Exception as exc:  # no database, no model, no room on the cluster, vLLM missing on the node
            AttemptDir(out).write_error(str(exc))
            print(OUTCOME_LINE + json.dumps({"code": EXIT_ERROR, "errors": {"vllm_server": str(exc)}}), flush=True)
            return EXIT_ERROR
        server_url = server[1]["url"]

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
    trainer = TorchTrainer(
        train_worker,
        train_loop_config={
            "job_id": job_id,
            "owner": owner,
            "attempt": attempt,
            "outcome": outcome,
            "server_url": server_url,
        },
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
        if server is not None:
            _check_server(server[0], out)  # exits when the server died: the ranks go with the driver
    ranks = ray.get(outcome.get.remote())
    code = exit_code(ranks, workers, failure[0] if failure else None)
    if server is not None:
        from worker import ray_vllm

        gone = _server_exit(server[0]) if code != 0 else None
        if gone is not None:  # the ranks failed because the server went away: say so, not their HTTP error
            AttemptDir(out).write_error(gone)
        ray_vllm.stop(server[0])
    errors = {str(r): i["error"] for r, i in sorted(ranks.items()) if i.get("error")}
    if failure:
        errors["ray"] = failure[0][-2000:]
    print(
        OUTCOME_LINE
        + json.dumps({"code": code, "ranks": {str(r): ranks[r].get("code") for r in ranks}, "errors": errors}),
        flush=True,
    )
    if failure and AttemptDir(out).read_error() is None:  # the ranks' own errors are in their error files
        AttemptDir(out).write_error(f"Ray Train failed: {failure[0]}")
    return code


def _start_server(settings: Settings, job_id: str, out: Any) -> tuple[Any, dict[str, Any]]:
    """The job's vLLM server (GRPO in server mode), placed by Ray: (actor, info). Announced in the
    log for the supervisor (a `vllm_server` event)."""
    from worker import ray_vllm
    from worker.child import load_job, model_resolver

    if DATABASE_ENV not in os.environ:  # the driver reads the job's spec and model from the store
        raise RuntimeError(no_database(socket.gethostname()))
    spec, project_id, config = load_job(settings, job_id)
    if not isinstance(spec, GRPOSpec):  # only GRPO's server mode starts one (its home's `needs`)
        raise RuntimeError(f"job {job_id} is a {spec.kind} job: only GRPO jobs get a vLLM server")
    model_path, _ = model_resolver(settings, job_id, project_id)(spec.model)
    actor, info = ray_vllm.start(
        spec, config.of(ResolvedGRPO), model_path, out / "vllm-server.log", settings.ray.server_cpus
    )
    print(ray_vllm.SERVER_LINE + json.dumps(info), flush=True)
    return actor, info


def _server_exit(actor: Any) -> str | None:
    """Why the job's vLLM server is gone (its exit code and the tail of its log), or None while it runs."""
    import ray

    try:
        code = ray.get(actor.exited.remote(), timeout=30)
        tail = ray.get(actor.log_tail.remote(600), timeout=30) if code is not None else ""
    except Exception as exc:  # the actor died (its node went away): the server with it
        code, tail = -1, f"{type(exc).__name__}: {str(exc)[:300]}"
    return None if code is None else f"the job's vLLM server exited with code {code}; its log ends: ...{tail}"


def _check_server(actor: Any, out: Any) -> None:
    """A server that exited mid-job fails the job with the tail of its log: the driver exits, and
    Ray ends the Train workers it owns (they would otherwise wait on a dead server)."""
    from worker.child import EXIT_ERROR

    message = _server_exit(actor)
    if message is None:
        return
    AttemptDir(out).write_error(message)
    print(OUTCOME_LINE + json.dumps({"code": EXIT_ERROR, "errors": {"vllm_server": message}}), flush=True)
    sys.stdout.flush()
    os._exit(EXIT_ERROR)


def main(argv: list[str]) -> int:
    job_id, owner, attempt, workers, gpus = argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5])
    with_server = len(argv) > 6 and argv[6] == "--vllm-server"
    t0 = time.monotonic()
    code = run(job_id, owner, attempt, workers, gpus, with_server)
    print(
        f"mathrl: Ray job of {job_id} attempt {attempt} ended with {code} after {time.monotonic() - t0:.1f}s",
        flush=True,
    )
    return code


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    os._exit(code)  # Ray's own threads would hold interpreter shutdown
