"""The `mathrl` CLI and the async SDK against the running service."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mathrl.cli import app
from mathrl.client import AsyncClient
from tests.helpers.env import ADMIN_TOKEN
from tests.helpers.service import Service

pytestmark = pytest.mark.slow
runner = CliRunner()


def cli(service: Service, key: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"MATHRL_URL": service.url, "MATHRL_API_KEY": key})
    return result.exit_code, result.output


def test_cli_submit_follow_list_get_logs_scores(service: Service, tiny_model: str, tmp_path: Path) -> None:
    key = service.key()
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"kind: eval\nmodel: {tiny_model}\nbenchmark: gsm8k\nlimit: 2\nsampling:\n  max_new_tokens: 8\ntags: [cli]\n"
    )
    code, out = cli(service, key, "jobs", "submit", str(spec), "--follow")
    assert code == 0, out
    assert "succeeded" in out and "scored" in out
    job_id = out.split("submitted ")[1].split()[0]
    code, out = cli(service, key, "jobs", "list", "--json", "--tag", "cli")
    assert code == 0 and json.loads(out)[0]["id"] == job_id
    code, out = cli(service, key, "jobs", "get", job_id)
    assert code == 0 and json.loads(out)["resolved_config"]["limit"] == 2
    code, out = cli(service, key, "jobs", "logs", job_id)
    assert code == 0 and "claimed" in out
    code, out = cli(service, key, "scores", "--job", job_id, "--json")
    assert code == 0 and {s["metric"] for s in json.loads(out)} >= {"accuracy"}
    code, out = cli(service, key, "jobs", "metrics", job_id)
    assert code == 0 and "eval/accuracy" in out


def test_cli_reports_problems_with_the_field(service: Service, tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("kind: grpo\nmodel: org/m\ndataset: {name: gsm8k-train}\nnum_generations: 1\n")
    code, out = cli(service, service.key(), "jobs", "submit", str(spec))
    assert code == 1 and "/num_generations" in out and "at least 2" in out
    hostile = tmp_path / "hostile.yaml"
    hostile.write_text("!!python/object/apply:os.system ['echo pwned']\n")
    code, out = cli(service, service.key(), "jobs", "submit", str(hostile))
    assert code != 0 and "pwned" not in out


def test_cli_keys_create_and_cancel(service: Service) -> None:
    result = runner.invoke(
        app, ["keys", "create", "--project", "cli-proj", "--admin-token", ADMIN_TOKEN], env={"MATHRL_URL": service.url}
    )
    assert result.exit_code == 0, result.output
    key = result.stdout.strip().splitlines()[-1]
    assert key.startswith("mrl_")
    job = service.client(key).jobs.create({"kind": "eval", "model": "org/m", "resources": {"gpus": 4}})
    code, out = cli(service, key, "jobs", "cancel", job.id)
    assert code == 0 and "cancelled" in out


def test_async_client(service: Service) -> None:
    async def go() -> None:
        async with AsyncClient(service.url, api_key=service.key()) as c:
            job = await c.jobs.create({"kind": "eval", "model": "org/m", "resources": {"gpus": 4}})
            assert (await c.jobs.retrieve(job.id)).status == "queued"
            assert [j.id async for j in c.jobs.list()] == [job.id]
            assert (await c.jobs.cancel(job.id)).status == "cancelled"
            assert [e.type async for e in c.jobs.follow(job.id)] == ["queued", "cancelled"]

    asyncio.run(go())


def test_service_errors_are_one_message_and_exit_1_from_every_command(service: Service, tmp_path: Path) -> None:
    """Issue 20.6: each command had its own except block for service errors (14 copies); one
    command group handles them now. A problem prints its status, title, detail and the
    pointers of its errors, never a traceback, and exits 1."""
    key = service.key()
    missing = "00000000-0000-0000-0000-000000000000"
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: eval\nmodel: org/m\nlimit: -3\n")
    cases = [
        (("jobs", "get", missing), "404"),
        (("jobs", "cancel", missing), "404"),
        (("jobs", "logs", missing), "404"),
        (("jobs", "metrics", missing), "404"),
        (("pipeline", "get", missing), "404"),
        (("keys", "revoke", missing), "404"),
        (("jobs", "submit", str(bad)), "/limit"),
    ]
    for args, expected in cases:
        code, out = cli(service, key, *args)
        assert code == 1 and expected in out and "Traceback" not in out, (args, code, out)
    code, out = cli(service, "mrl_not-a-key", "jobs", "list")
    assert code == 1 and "401" in out, out


def test_the_local_eval_takes_a_path_relative_to_where_it_runs(
    tiny_model: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`mathrl-server eval --model models/x` as the README writes it: only the API refuses
    relative paths (it cannot know the caller's directory); a local command resolves them."""
    from service.cli import app as server_app

    model = Path(tiny_model)
    monkeypatch.chdir(model.parent.parent.parent)
    relative = str(model.relative_to(model.parent.parent.parent))  # three parts: no hub id ('org/name') either
    args = ["eval", "--model", relative, "--benchmark", "arith", "--limit", "3", "--max-new-tokens", "4"]
    result = CliRunner().invoke(server_app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "accuracy" in result.output and "is not a hub id" not in result.output
    assert len((tmp_path / "items.jsonl").read_text().splitlines()) == 3
