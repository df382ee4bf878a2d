"""A Hugging Face hub on loopback, serving dataset and model repositories from local folders: the
routes `datasets`, `transformers` and `huggingface_hub` call to resolve a repository, list its
files and download them (repository info, tree, paths-info, resolve). No hub is reachable from
the tests; with HF_ENDPOINT pointing here, `datasets.load_dataset("org/name")` and
`from_pretrained("org/name")` run their real hub code paths (datasets' HubDatasetModuleFactory:
hf://datasets/org/name@<commit>/... files), which a local folder given as the id does not."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


def commit(repo: str, folder: Path) -> str:
    """The repository's head commit: a hash of its files, so changing a file makes a new commit."""
    h = hashlib.sha1(repo.encode())
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode() + hashlib.sha1(p.read_bytes()).digest())
    return h.hexdigest()


class FakeHub:
    """`with FakeHub(datasets={"org/name": folder}, models={...}) as hub:` serves them at
    `hub.endpoint`; `hub.calls` lists the requests, in order, and `hub.auth` each one's path and
    Authorization header. With `token`, its repositories are private to that token: a request
    without it is answered as the hub answers one for a private repository (401, RepoNotFound)."""

    def __init__(
        self, datasets: dict[str, Path] | None = None, models: dict[str, Path] | None = None, token: str | None = None
    ):
        named = {f"datasets/{r}": f for r, f in (datasets or {}).items()} | {
            f"models/{r}": f for r, f in (models or {}).items()
        }
        self.repos = {repo: Path(folder) for repo, folder in named.items()}
        self.token = token
        self.calls: list[str] = []
        self.auth: list[tuple[str, str | None]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> FakeHub:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                hub.calls.append(f"{self.command} {self.path}")

            def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _json(self, obj: Any) -> None:
                self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"})

            def _missing(self, code: str = "EntryNotFound") -> None:
                self._send(404, b"", {"X-Error-Code": code})

            def _route(self) -> None:
                hub.auth.append((self.path, self.headers.get("authorization")))
                url = urlsplit(self.path)
                parts = [unquote(p) for p in url.path.strip("/").split("/")]
                api = parts[:1] == ["api"]
                if api:  # /api/{datasets,models}/org/name/...
                    repo, rest = "/".join(parts[1:4]), parts[4:]
                elif parts[:1] == ["datasets"]:  # /datasets/org/name/resolve/...
                    repo, rest = "/".join(parts[0:3]), parts[3:]
                else:  # /org/name/resolve/...: a model's
                    repo, rest = "models/" + "/".join(parts[0:2]), parts[2:]
                if repo not in hub.repos:
                    return self._missing("RepoNotFound")
                if hub.token is not None and self.headers.get("authorization") != f"Bearer {hub.token}":
                    return self._send(401, b"", {"X-Error-Code": "RepoNotFound"})
                folder = hub.repos[repo]
                sha = commit(repo, folder)  # a new commit whenever the folder's files change
                if (
                    rest[1:2]
                    and rest[0] in ("revision", "tree", "paths-info", "resolve")
                    and rest[1] not in ("main", sha)
                ):
                    return self._missing("RevisionNotFound")

                def entry(path: str) -> dict[str, Any]:
                    p = folder / path
                    if p.is_dir():
                        return {"type": "directory", "oid": sha, "size": 0, "path": path}
                    oid = hashlib.sha1(p.read_bytes()).hexdigest()
                    return {"type": "file", "oid": oid, "size": p.stat().st_size, "path": path}

                if api and (not rest or rest[0] == "revision"):
                    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
                    info = {"id": repo.split("/", 1)[1], "sha": sha, "private": False, "gated": False}
                    return self._json({**info, "disabled": False, "siblings": [{"rfilename": f} for f in files]})
                if api and rest[0] == "tree":
                    base = folder / "/".join(rest[2:])
                    if not base.is_dir():
                        return self._missing()
                    recursive = parse_qs(url.query).get("recursive", ["false"])[0].lower() == "true"
                    found = base.rglob("*") if recursive else base.iterdir()
                    return self._json([entry(str(p.relative_to(folder))) for p in sorted(found)])
                if api and rest[0] == "paths-info":
                    form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
                    return self._json([entry(p) for p in form.get("paths", []) if (folder / p).exists()])
                if not api and rest[:1] == ["resolve"]:
                    p = folder / "/".join(rest[2:])
                    if not p.is_file():
                        return self._missing()
                    body = p.read_bytes()
                    return self._send(200, body, {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'})
                return self._missing()

            do_GET = do_HEAD = do_POST = _route

        return Handler
