"""The `mathrl` CLI where no service answers, and with spec files it cannot read: a message that says
what to check and exit code 1, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mathrl.cli import app
from tests.helpers.env import free_port

pytestmark = pytest.mark.quick
runner = CliRunner()


@pytest.mark.parametrize("url", ["http://127.0.0.1:{port}", "127.0.0.1:{port}"])  # down; no scheme
def test_no_service_at_the_url_is_a_message_not_a_traceback(url: str) -> None:
    env = {"MATHRL_URL": url.format(port=free_port()), "MATHRL_API_KEY": "k"}
    result = runner.invoke(app, ["jobs", "list"], env=env)
    assert result.exit_code == 1, result.output
    assert "cannot reach" in result.output and "MATHRL_URL" in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception


def test_a_spec_file_that_is_not_utf8_is_a_message(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("kind: eval\nmodel: org/m\n", encoding="utf-16")  # what PowerShell's `>` writes
    result = runner.invoke(app, ["jobs", "submit", str(spec)], env={"MATHRL_URL": "http://127.0.0.1:1"})
    assert result.exit_code == 2 and "cannot be read as UTF-8 text" in result.output, result.output
    assert isinstance(result.exception, SystemExit), result.exception
