"""The operator's hub token reaches only the repositories the operator lists (worker/hub_access.py).

A hub on loopback (tests/helpers/fake_hub.py, at HF_ENDPOINT as a mirror is set) records each
request's Authorization header, and answers as the hub does for a private repository read without
its token (401, RepoNotFound). The job process runs as the worker starts it (`python -m
worker.child`), with HF_TOKEN in its environment as the chart gives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from kinds import home
from mathrl.specs import AnySpec, EvalSpec
from store.db import session_scope
from store.models import BenchmarkScore
from tests.helpers.fake_hub import FakeHub
from tests.helpers.store import store_with_jobs
from worker import hub_access
from worker.attempt import AttemptDir, attempt_dir

SECRET = "hf_operator_secret_token"
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.quick
@pytest.mark.parametrize(
    ("path", "repo"),
    [
        ("/acme/m/resolve/main/config.json", "acme/m"),
        ("/datasets/acme/d/resolve/abc/README.md", "acme/d"),
        ("/api/models/acme/m/revision/main", "acme/m"),
        ("/api/datasets/acme/d/tree/abc/data", "acme/d"),
        ("/api/models/acme/m/xet-read-token/abc", "acme/m"),
        ("/api/models/acme/m", "acme/m"),
        ("/gpt2/resolve/main/config.json", "gpt2"),
        ("/api/models/gpt2/revision/main", "gpt2"),
        ("/api/whoami-v2", None),
        ("/api/collections/x", None),
        ("/", None),
    ],
)
def test_the_repository_a_hub_url_names(path: str, repo: str | None) -> None:
    assert hub_access.repo_of(path) == repo


@pytest.mark.quick
def test_patterns_match_whole_ids() -> None:
    assert hub_access.listed("acme/m", ["acme/*"])
    assert not hub_access.listed("acme-evil/m", ["acme/*"])
    assert not hub_access.listed("other/acme", ["acme/*"])
    assert not hub_access.listed("acme/m", [])
    assert hub_access.listed("Qwen/Qwen2.5-7B", ["Qwen/Qwen2.5-*"])


@pytest.mark.quick
def test_a_vllm_server_gets_the_token_only_for_a_listed_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.vllm_server import server_env

    monkeypatch.setattr(hub_access, "_state", {"patterns": (), "token": None, "installed": False})
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", SECRET)
    listed = server_env("acme/m", ["acme/*"])
    assert listed["HF_TOKEN"] == SECRET and "HF_HUB_DISABLE_IMPLICIT_TOKEN" not in listed
    for model in ("other/m", "/models/acme/m", ""):
        env = server_env(model, ["acme/*"])
        assert SECRET not in env.values(), model
        assert env["HF_HUB_DISABLE_IMPLICIT_TOKEN"] == "1" and env["HF_TOKEN_PATH"] == hub_access.NO_TOKEN_FILE
    assert SECRET not in server_env("acme/m").values()  # no list given: no token


def _hub_env(tmp_path: Path, hub: str, url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MATHRL_", "TRANSFORMERS_"))}
    env.update(
        HF_ENDPOINT=hub,
        HF_TOKEN=SECRET,
        HF_HOME=str(tmp_path / "hf"),
        MATHRL_DATABASE__URL=url,
        MATHRL_ARTIFACT_DIR=str(tmp_path / "artifacts"),
        MATHRL_SOURCES__HUB_TOKEN_REPOS=json.dumps(["acme/*"]),
        PYTHONPATH=str(ROOT),
    )
    return env


def resolve_config(spec: AnySpec) -> dict[str, Any]:
    return dict(home(spec).resolve(spec).model_dump(mode="json"))


def test_a_job_process_sends_the_token_only_for_listed_repositories(tmp_path: Path, tiny_model: str) -> None:
    """Before: a job naming any hub id was fetched with the operator's token, so any project read the
    private and gated repositories the operator's account can. Both repositories here are private to
    the operator's token: the listed one loads and the job scores it, the other is not found."""
    specs = [EvalSpec(model=model, benchmark="gsm8k", limit=1) for model in ("other/private", "acme/private")]
    running = {"status": "running", "lease_owner": "owner", "attempts": 1}
    jobs = [
        {"kind": "eval", "spec": s.model_dump(mode="json"), "resolved_config": resolve_config(s), **running}
        for s in specs
    ]
    url, _, ids = store_with_jobs(tmp_path, *jobs)
    with FakeHub(models={"other/private": Path(tiny_model), "acme/private": Path(tiny_model)}, token=SECRET) as hub:
        env = _hub_env(tmp_path, hub.endpoint, url)
        codes = [_job_process(job_id, env) for job_id in ids]
    assert codes[0] != 0 and codes[1] == 0, (codes, hub.auth)
    other = {auth for path, auth in hub.auth if "/other/" in path}
    acme = {auth for path, auth in hub.auth if "/acme/" in path}
    assert other == {None} and acme == {f"Bearer {SECRET}"}, hub.auth
    error = AttemptDir(attempt_dir(str(tmp_path / "artifacts"), ids[0], 1)).read_error()
    assert "other/private" in str(error) and "not a valid model identifier" in str(error), error
    with session_scope(url) as s:
        assert set(s.scalars(select(BenchmarkScore.job_id))) == {ids[1]}  # the listed model was scored


def _job_process(job_id: str, env: dict[str, str]) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "worker.child", job_id, "owner", "1"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode


def test_an_explicit_token_is_taken_off_an_unlisted_repository(tmp_path: Path) -> None:
    """A library that passes the token itself (vLLM's hf_token, datasets' token) cannot send it for an
    unlisted repository either; and nothing in the process's environment holds it."""
    code = f"""
import os
from huggingface_hub import hf_hub_download
from config.settings import get_settings
from worker import hub_access
from worker.attempt import AttemptDir, attempt_dir
hub_access.install(get_settings().sources.hub_token_repos)
assert not any(v == {SECRET!r} for v in os.environ.values()), "the token is still in the environment"
for repo in ("other/explicit", "acme/explicit"):
    try:
        hf_hub_download(repo, "config.json", token={SECRET!r})
    except Exception:
        pass
from evaluator.data import _checked_revision
for repo in ("other/data", "acme/data"):
    try:
        _checked_revision(repo)
    except Exception:
        pass
"""
    with FakeHub() as hub:
        env = _hub_env(tmp_path, hub.endpoint, f"sqlite:///{tmp_path / 'none.db'}")
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = dict.fromkeys(("other/explicit", "acme/explicit", "other/data", "acme/data"))
    for path, auth in hub.auth:
        for repo in seen:
            if f"/{repo}/" in path or path.endswith(f"/{repo}"):
                seen[repo] = auth or "none"
    assert seen == {
        "other/explicit": "none",
        "acme/explicit": f"Bearer {SECRET}",
        "other/data": "none",
        "acme/data": f"Bearer {SECRET}",
    }, hub.auth
