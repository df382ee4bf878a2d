"""A raw path is checked again by the job process, on its worker's view, before anything loads
(worker/child.py `_check_raw_paths`): the API admitted it under a root, outside the service's
storage (tests/unit/api/test_tenants.py), and a link under that root may point elsewhere since."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.settings import Settings
from mathrl.specs import parse_spec
from worker.child import _check_raw_paths

pytestmark = pytest.mark.quick


def test_a_link_that_now_points_into_storage_fails_the_job_naming_the_field(tmp_path: Path) -> None:
    artifacts, root = tmp_path / "artifacts", tmp_path / "shared"
    stored = artifacts / "jobs" / "another-projects-job" / "train" / "final"
    stored.mkdir(parents=True)
    (root / "models").mkdir(parents=True)
    settings = Settings(artifact_dir=str(artifacts), sources={"cache_dirs": [str(tmp_path / "cache")]})  # type: ignore[arg-type]
    link = root / "models" / "m"
    link.mkdir()  # what the API saw: a model under the root
    data = root / "d.jsonl"
    data.write_text('{"question": "1 + 1?", "answer": "2"}\n')
    eval_spec = {"kind": "eval", "model": str(link), "limit": 1, "dataset": {"path": str(data)}}
    _check_raw_paths(parse_spec(eval_spec), settings)  # fine as it is
    link.rmdir()
    link.symlink_to(stored)  # changed since: into another project's model
    with pytest.raises(ValueError, match="^model: .* resolves into the service's own storage"):
        _check_raw_paths(parse_spec(eval_spec), settings)
    cached = tmp_path / "cache" / "datasets" / "x.jsonl"
    cached.parent.mkdir(parents=True)
    cached.write_text(data.read_text())
    data.unlink()
    data.symlink_to(cached)  # a dataset file now a link into the workers' cache
    spec = parse_spec({**eval_spec, "model": "org/model", "dataset": {"path": f"file://{data}"}})
    with pytest.raises(ValueError, match="^dataset/path: "):
        _check_raw_paths(spec, settings)
    # typed references and hub ids are not paths: the store resolves them against the job's project
    _check_raw_paths(
        parse_spec(
            {**eval_spec, "model": "job:" + "0" * 8 + "-0000-0000-0000-" + "0" * 12, "dataset": {"hub": "org/set"}}
        ),
        settings,
    )
