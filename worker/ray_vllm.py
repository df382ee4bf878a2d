"""The vLLM server of a GRPO job in server mode on the Ray cluster, placed by Ray.

The job's driver (worker.ray_train) calls `start`: a Ray actor (`GenerationServer`) holding the
server's own resources, `generation.server_gpus` GPUs and `ray.server_cpus` CPUs, placed before the
Train workers and waited for up to PLACEMENT_SECONDS. In it runs the same command as on one node
(worker.vllm_server.server_command), on the node's address, under the same guard. The ranks reach it
at MATHRL_VLLM_SERVER_URL: a LoRA adapter is loaded by path from the shared artifact directory; full
weights go over TRL's NCCL sync (GPUs only). docs/how-jobs-run.md, "Past one node: Ray"."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from mathrl.specs import GRPOSpec
from mathrl.specs.resolved import ResolvedGRPO

PLACEMENT_SECONDS = 600.0  # how long the driver waits for Ray to place and start the server

SERVER_LINE = "mathrl-vllm-server: "  # printed by the driver once the server is up (worker.ray_submit reads it)


class GenerationServer:
    """A Ray actor (made remote by `server_actor`) that runs the job's vLLM server on its node."""

    def __init__(self) -> None:
        self.server: Any = None

    def start(self, spec: GRPOSpec, config: ResolvedGRPO, model_path: str, log_path: str) -> dict[str, Any]:
        """Start the server; its URL and where it runs."""
        import os
        import socket

        import ray

        from config.settings import get_settings
        from worker.vllm_server import free_port, launch, server_command, server_env

        host = ray.util.get_node_ip_address()
        port = free_port(host)
        on_gpu = spec.resources.gpus > 0
        settings = get_settings()
        cmd = server_command(spec, config, model_path, port, on_gpu, host=host, engine=settings.vllm.engine())
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        env = server_env(model_path, settings.sources.hub_token_repos)
        self.server = launch(cmd, port, env, Path(log_path), None, host=host)
        return {
            "url": self.server.url,
            "pid": self.server.proc.pid,
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "actor_pid": os.getpid(),
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "") if on_gpu else "",
        }

    def exited(self) -> int | None:
        """The server's exit code once it exited, else None."""
        return None if self.server is None else self.server.exited()

    def log_tail(self, chars: int = 3000) -> str:
        return "" if self.server is None else str(self.server.log_tail(chars))

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def server_actor(spec: GRPOSpec, server_cpus: float) -> Any:
    """The actor class with the server's resources: its GPUs (GPU jobs), and `server_cpus` CPUs."""
    import ray

    gpus = spec.generation.resolved_server_gpus(spec.resources.gpus)
    return ray.remote(num_cpus=server_cpus, num_gpus=gpus, max_restarts=0)(GenerationServer)


def start(
    spec: GRPOSpec, config: ResolvedGRPO, model_path: str, log_path: Path, server_cpus: float
) -> tuple[Any, dict[str, Any]]:
    """Place the actor and start the server in it. Returns the actor and the server's info; raises
    RuntimeError saying what to change when Ray cannot place it in time or the start fails."""
    import ray
    from ray.exceptions import GetTimeoutError

    actor = server_actor(spec, server_cpus).remote()
    t0 = time.monotonic()
    try:
        info: dict[str, Any] = ray.get(
            actor.start.remote(spec, config, model_path, str(log_path)), timeout=PLACEMENT_SECONDS
        )
    except GetTimeoutError:
        ray.kill(actor)
        gpus = spec.generation.resolved_server_gpus(spec.resources.gpus)
        raise RuntimeError(
            f"the Ray cluster placed no vLLM server for this job within {PLACEMENT_SECONDS:.0f} s: it needs a "
            f"node with {gpus} free GPU(s) and {server_cpus:g} free CPU(s) (generation.server_gpus, "
            "MATHRL_RAY__SERVER_CPUS) besides the training workers' resources"
        ) from None
    except Exception as exc:
        ray.kill(actor)
        raise RuntimeError(f"starting the vLLM server on the Ray cluster failed: {type(exc).__name__}: {exc}") from None
    info["placed_seconds"] = round(time.monotonic() - t0, 1)
    return actor, info


def stop(actor: Any) -> None:
    """Stop the server, then the actor (the guard also kills the server if the actor dies first)."""
    import ray

    try:
        ray.get(actor.stop.remote(), timeout=60)
    except Exception:  # the actor is gone already: its guard took the server with it
        pass
    ray.kill(actor)
