"""Dataset URLs: the allow-list compared by scheme, host, port and path segments, and checked
again when the job process fetches (issue 16.8), redirects included."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from config import sources
from config.sources import RefusedURL, fetch_url, under_prefix, url_refusal

pytestmark = pytest.mark.quick


@pytest.mark.parametrize(
    ("value", "prefix", "allowed"),
    [
        ("https://a.com/x.jsonl", "https://a.com", True),
        ("https://a.com.evil/x.jsonl", "https://a.com", False),  # a string prefix admitted this
        ("https://a.com@evil.com/x.jsonl", "https://a.com", False),
        ("https://a.com/data/x.jsonl", "https://a.com/data", True),
        ("https://a.com/data/x.jsonl", "https://a.com/data/", True),
        ("https://a.com/data2/x.jsonl", "https://a.com/data", False),
        ("https://a.com/data/../secret.jsonl", "https://a.com/data", False),
        ("https://a.com:443/data/x.jsonl", "https://a.com/data", True),
        ("https://a.com:8443/data/x.jsonl", "https://a.com/data", False),
        ("http://a.com/data/x.jsonl", "https://a.com/data", False),
        ("HTTPS://A.COM/data/x.jsonl", "https://a.com/data", True),
    ],
)
def test_prefixes_compare_whole_hosts_and_segments(value: str, prefix: str, allowed: bool) -> None:
    assert under_prefix(value, prefix) is allowed


def test_refusals_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "is_public", lambda host: host != "10.0.0.1")
    assert url_refusal("https://a.com/x.jsonl", ["https://a.com"]) is None
    assert "allow-listed" in (url_refusal("https://a.com.evil/x.jsonl", ["https://a.com"]) or "")
    assert "credentials" in (url_refusal("https://u:p@a.com/x.jsonl", ["https://a.com"]) or "")
    assert "private" in (url_refusal("http://10.0.0.1/x.jsonl", ["http://10.0.0.1"]) or "")
    assert "only http(s)" in (url_refusal("ftp://a.com/x.jsonl", ["ftp://a.com"]) or "")


class _Handler(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, dict[str, str], bytes]]] = {}
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        status, headers, body = self.routes.get(self.path, (404, {}, b""))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A local HTTP server, treated as a public host (loopback is refused otherwise)."""
    monkeypatch.setattr(sources, "is_public", lambda host: True)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    rows = b'{"question": "1+1?", "answer": "2"}\n'
    _Handler.hits = []
    _Handler.routes = {
        "/sets/real.jsonl": (200, {}, rows),
        "/sets/moved.jsonl": (302, {"Location": "/sets/real.jsonl"}, b""),
        "/sets/away.jsonl": (302, {"Location": "/private/real.jsonl"}, b""),
        "/private/real.jsonl": (200, {}, rows),
        "/sets/loop.jsonl": (302, {"Location": "/sets/loop.jsonl"}, b""),
    }
    yield base
    httpd.shutdown()


def test_fetch_follows_redirects_only_under_the_prefix(server: str, tmp_path: Path) -> None:
    prefixes = [f"{server}/sets"]
    got = fetch_url(f"{server}/sets/moved.jsonl", prefixes, tmp_path / "a")
    assert got.name == "real.jsonl" and b'"answer": "2"' in got.read_bytes()
    with pytest.raises(RefusedURL, match="redirected from .* to a refused URL"):
        fetch_url(f"{server}/sets/away.jsonl", prefixes, tmp_path / "b")
    assert "/private/real.jsonl" not in _Handler.hits  # refused before it was requested
    with pytest.raises(RefusedURL, match="redirects"):
        fetch_url(f"{server}/sets/loop.jsonl", prefixes, tmp_path / "c")


def test_fetch_checks_the_host_again_when_it_fetches(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admitted at submit, the host now resolves to a private address (DNS rebinding)."""
    monkeypatch.setattr(sources, "is_public", lambda host: False)
    with pytest.raises(RefusedURL, match="private"):
        fetch_url(f"{server}/sets/real.jsonl", [f"{server}/sets"], tmp_path)
    assert _Handler.hits == []


def test_the_job_process_reads_its_own_checked_copy(server: str, tmp_path: Path) -> None:
    from config.settings import Settings
    from mathrl.specs import parse_spec
    from worker.attempt import attempt_dir
    from worker.child import _fetch_dataset

    settings = Settings(artifact_dir=str(tmp_path), sources={"allowed_url_prefixes": [f"{server}/sets"]})  # type: ignore[arg-type]
    spec = parse_spec({"kind": "eval", "model": "org/m", "dataset": {"path": f"{server}/sets/moved.jsonl"}})
    work = attempt_dir(settings.artifact_dir, "job-1", 1)
    fetched = _fetch_dataset(spec, settings, work, "project-1")
    local = Path(fetched.dataset.path)
    assert local.is_relative_to(tmp_path / "jobs" / "job-1" / "attempt-1" / "data") and local.read_text().startswith(
        '{"question"'
    )
    assert fetched.dataset.question_field == spec.dataset.question_field
