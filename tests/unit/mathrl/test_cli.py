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


def test_yaml_values_json_cannot_carry_are_a_message_and_dates_are_text(tmp_path: Path) -> None:
    """`name: 2024-06-01` was a date and `learning_rate: .nan` a NaN: the request could not encode
    them, and the CLI printed a traceback."""
    from mathrl.cli import load_spec_file

    spec = tmp_path / "spec.yaml"
    spec.write_text("kind: eval\nmodel: org/m\nname: 2024-06-01\ntags: [2024-06-02T10:00:00]\n")
    assert load_spec_file(spec)["name"] == "2024-06-01" and load_spec_file(spec)["tags"] == ["2024-06-02T10:00:00"]
    env = {"MATHRL_URL": "http://127.0.0.1:1"}
    for body, where in (
        ("sampling: {temperature: .nan}", "sampling.temperature"),
        ("tags: [!!binary aGk=]", "tags[0]"),
    ):
        spec.write_text(f"kind: eval\nmodel: org/m\n{body}\n")
        result = runner.invoke(app, ["jobs", "submit", str(spec)], env=env)
        assert result.exit_code == 2 and f"{where} is not a value JSON can carry" in _said(result), result.output
        assert isinstance(result.exception, SystemExit), result.exception
    spec.write_text("[" * 5000)
    result = runner.invoke(app, ["jobs", "submit", str(spec)], env=env)
    assert result.exit_code == 2 and "is not valid YAML" in _said(result), result.output


def _said(result: object) -> str:
    """The output's words, without rich's box drawing and line wrapping."""
    return " ".join(str(getattr(result, "output", "")).replace("│", " ").split())
