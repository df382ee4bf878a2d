"""What decides that a job runs on Ray and what its Ray job carries, with no cluster: routing by
resources.nodes, quotas and world size, the secrets kept out, the exit code, the vLLM server's GPUs
(the jobs on a real cluster: tests/system/test_ray.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.jobs import grpo, sft


@pytest.mark.quick
def test_nodes_route_to_ray_count_in_quotas_and_the_world_size() -> None:
    from mathrl.specs import parse_spec
    from mathrl.specs.presets import resolve_grpo

    spec = parse_spec(sft(resources={"nodes": 4, "gpus": 8}))
    assert spec.resources.queue == "ray" and spec.resources.total_gpus == 32
    assert parse_spec(sft(resources={"nodes": 2, "pool": "h100"})).resources.queue == "h100"
    g = parse_spec(grpo(resources={"nodes": 2, "processes": 2}, global_batch_size=32))
    assert resolve_grpo(g)["world_size"] == 4 and resolve_grpo(g)["gradient_accumulation_steps"] == 1


@pytest.mark.quick
@pytest.mark.parametrize(
    "body",
    [
        {"kind": "eval", "model": "org/m", "resources": {"nodes": 2}},
        {
            "kind": "grade",
            "grader": {"type": "reward_model", "model": "org/rm"},
            "items": [{"completion": "1", "answer": "1"}],
            "resources": {"nodes": 2},
        },
    ],
)
def test_only_training_jobs_span_nodes(body: dict[str, Any]) -> None:
    from pydantic import ValidationError

    from mathrl.specs import parse_spec

    with pytest.raises(ValidationError, match="resources"):
        parse_spec(body)


@pytest.mark.quick
def test_the_ray_job_never_carries_the_secrets() -> None:
    from worker.ray_submit import forwarded_env, submission_id

    env = {
        "MATHRL_DATABASE__URL": "postgresql://u:secret@db/x",
        "MATHRL_BROKER__URL": "redis://:secret@r/0",
        "MATHRL_AUTH__ADMIN_TOKEN": "t",
        "MATHRL_ARTIFACT_DIR": "/a",
        "HF_HUB_OFFLINE": "1",
        "PATH": "/bin",
    }
    assert forwarded_env(env) == {"MATHRL_ARTIFACT_DIR": "/a", "HF_HUB_OFFLINE": "1"}
    assert submission_id("j", 2) == "mathrl-j-2"


@pytest.mark.quick
def test_the_ray_jobs_exit_code_is_rank_zeros_unless_another_rank_failed() -> None:
    from worker.ray_train import exit_code

    ok = {0: {"code": 0}, 1: {"code": 0}}
    assert exit_code(ok, 2, None) == 0
    assert exit_code({0: {"code": 2}, 1: {"code": 2}}, 2, None) == 2  # stopped on request
    assert exit_code({0: {"code": 0}, 1: {"code": 1}}, 2, None) == 1
    assert exit_code({0: {"code": 0}}, 2, None) == 1  # a rank never reported
    assert exit_code(ok, 2, "TrainingFailedError: worker died") == 1


@pytest.mark.quick
def test_a_ray_grpo_jobs_vllm_server_takes_its_gpus_from_the_whole_job_on_one_node() -> None:
    """One server per job on Ray, on one node: server_gpus come out of gpus x nodes (the training
    world and the Ray Train workers are the rest), and may not exceed one node's gpus."""
    from pydantic import ValidationError

    from mathrl.specs import parse_spec
    from mathrl.specs.presets import resolve_grpo
    from worker.ray_submit import ray_workers

    server = {"backend": "vllm", "mode": "server", "server_gpus": 2}
    g = parse_spec(grpo(resources={"nodes": 2, "gpus": 4}, generation=server, global_batch_size=48))
    assert resolve_grpo(g)["world_size"] == ray_workers(g) == 6 and resolve_grpo(g)["vllm_server_gpus"] == 2
    whole_node = parse_spec(grpo(resources={"nodes": 2, "gpus": 2}, generation=server, global_batch_size=16))
    assert ray_workers(whole_node) == 2  # the server has one node to itself
    with pytest.raises(ValidationError, match="runs on one node"):
        parse_spec(grpo(resources={"nodes": 2, "gpus": 1}, generation=server))
    cpu = parse_spec(grpo(resources={"nodes": 2}, generation={"backend": "vllm", "mode": "server"}, lora={"r": 8}))
    assert ray_workers(cpu) == 2  # a CPU job's server takes ray.server_cpus, no training process
    # the driver starts a server (and reads the store for it) only for a job in server mode
    from config.settings import Settings
    from worker.ray_submit import entrypoint

    command, gpus, cpus = entrypoint(Settings(), cpu, "j", "o", 1)
    assert command.endswith(" j o 1 2 0 --vllm-server") and (gpus, cpus) == (0, 0), command
    assert "--vllm-server" not in entrypoint(Settings(), parse_spec(sft(resources={"nodes": 2})), "j", "o", 1)[0]
