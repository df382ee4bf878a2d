"""Which hub repositories get the operator's hub token.

The operator's token reads whatever its account can, so it is sent only for the repositories
the operator lists (`sources.hub_token_repos`, fnmatch patterns over 'org/name', models and
datasets alike: `listed`); every other id is fetched as by anyone without an account. `install`
sets this up in each process that may read the hub for a job: the token leaves the environment,
and huggingface_hub's HTTP client sends it only where the URL names a listed repository
(`authorize`). `env_for` gives a process started for one model the token only where that model
is listed. How it works and what it leaves as it is: RELIABILITY.md, "`worker/hub_access.py`:
the operator's hub token".
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

# where huggingface_hub finds a token of itself (huggingface_hub.utils._auth.get_token)
TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE")
# a token file that is not there (its folder is not either: huggingface_hub reads the file and takes
# FileNotFoundError for "no token"; a path under /dev/null raised NotADirectoryError, which it does not)
NO_TOKEN_FILE = "/nonexistent/mathrl-no-hub-token"
_API_KINDS = ("models", "datasets", "spaces")

_state: dict[str, Any] = {"patterns": (), "token": None, "installed": False}


def listed(repo: str | None, patterns: Iterable[str] | None = None) -> bool:
    """Whether `repo` ('org/name') is one the operator's token is sent for."""
    pats = _state["patterns"] if patterns is None else tuple(patterns)
    return bool(repo) and any(fnmatch.fnmatchcase(str(repo), p) for p in pats)


def repo_of(path: str) -> str | None:
    """The repository a hub URL's path names: '/org/name/resolve/...', '/datasets/org/name/...',
    '/api/models/org/name/...', '/api/datasets/org/name/tree/...' (a one-part legacy id, 'gpt2',
    too); None for a path that names none ('/api/whoami-v2')."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        if len(parts) < 3 or parts[1] not in _API_KINDS:
            return None
        rest = parts[2:]
    elif parts[:1] in (["datasets"], ["spaces"]):
        rest = parts[1:]
    else:
        rest = parts
    if not rest:
        return None
    # 'org/name/<verb>/...' or a one-part id followed by its verb
    verbs = {"resolve", "revision", "tree", "paths-info", "xet-read-token", "refs", "commits", "blob", "raw"}
    if len(rest) >= 2 and rest[1] not in verbs:
        return f"{rest[0]}/{rest[1]}"
    return rest[0]


def _hub_host(host: str | None) -> bool:
    from huggingface_hub import constants

    return bool(host) and str(host).lower() in constants.HF_URL_HOSTS


def authorize(request: Any) -> None:
    """The request hook: the token on a listed repository's request to a hub host; no
    Authorization header on any other request through huggingface_hub's client."""
    url = urlsplit(str(request.url))
    token = _state["token"]
    if token and _hub_host(url.hostname) and listed(repo_of(url.path)):
        request.headers["authorization"] = f"Bearer {token}"
    else:
        request.headers.pop("authorization", None)


async def _authorize_async(request: Any) -> None:
    authorize(request)


def _client() -> Any:
    from huggingface_hub.utils import _http

    client = _http.default_client_factory()
    client.event_hooks["request"] = [authorize, *client.event_hooks["request"]]
    return client


def _async_client() -> Any:
    from huggingface_hub.utils import _http

    client = _http.default_async_client_factory()
    client.event_hooks["request"] = [_authorize_async, *client.event_hooks["request"]]
    return client


def install(patterns: Iterable[str]) -> None:
    """In this process: the token kept here, out of the environment, sent only for `patterns`."""
    import huggingface_hub
    from huggingface_hub import constants, get_token

    if not _state["installed"]:
        try:
            _state["token"] = get_token()
        except Exception:  # an OIDC exchange that fails: no token, as with none set
            _state["token"] = None
    _state["patterns"] = tuple(patterns)
    _state["installed"] = True
    for name in TOKEN_ENV:
        os.environ.pop(name, None)
    os.environ["HF_TOKEN_PATH"] = NO_TOKEN_FILE
    constants.HF_TOKEN_PATH = NO_TOKEN_FILE
    constants.HF_STORED_TOKENS_PATH = NO_TOKEN_FILE
    constants.HF_HUB_DISABLE_IMPLICIT_TOKEN = True
    huggingface_hub.set_client_factory(_client)
    huggingface_hub.set_async_client_factory(_async_client)


def env_for(
    model: str | None, env: MutableMapping[str, str], patterns: Iterable[str] | None = None
) -> MutableMapping[str, str]:
    """`env`, for a process started to load `model`: the kept token as HF_TOKEN where `model` is a
    listed repository (a vLLM server of it, the engine processes vLLM starts), and no token, no
    token file and no implicit token otherwise. Where `install` has not run here (a Ray actor), the
    environment's own token is what there is to keep, and `patterns` the operator's list."""
    from mathrl.modelref import is_hub_id

    token = _state["token"] if _state["installed"] else next((env[k] for k in TOKEN_ENV[:2] if env.get(k)), None)
    for name in TOKEN_ENV:
        env.pop(name, None)
    env["HF_TOKEN_PATH"] = NO_TOKEN_FILE
    if token and model and is_hub_id(model) and listed(model, patterns):
        env["HF_TOKEN"] = token
        env.pop("HF_HUB_DISABLE_IMPLICIT_TOKEN", None)
    else:
        env["HF_HUB_DISABLE_IMPLICIT_TOKEN"] = "1"
    return env


def job_env(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """`env` for a job's process, which runs `install` itself: the kept token handed on (it decides
    per repository, as here)."""
    if _state["installed"] and _state["token"]:
        env["HF_TOKEN"] = _state["token"]
    return env
