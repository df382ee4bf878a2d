"""Where a dataset URL may come from, checked twice: by the API when the job is submitted, and
by the job process when it fetches (DNS may answer differently by then, and a redirect may
point anywhere). `url_refusal` says why a URL is refused, or None; `fetch_url` downloads one,
re-checking the URL and every redirect hop before it connects.

A URL is allowed when it is http(s), carries no credentials, lies under an operator prefix
(`sources.allowed_url_prefixes`), compared by scheme, host, port and whole path segments (the
prefix `https://a.com/data` admits `https://a.com/data/x.jsonl`, not `https://a.com.evil/`
nor `https://a.com/data2/`), and every address its host resolves to is public.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import Path
from urllib.parse import SplitResult, unquote, urljoin, urlsplit

MAX_REDIRECTS = 5
_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_public(host: str) -> bool:
    """True when every address the host names is public (not private/loopback/link-local/...)."""
    try:
        addresses = [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            return False
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not addresses:
        return False
    for addr in addresses:
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if not addr.is_global or addr.is_multicast:
            return False
    return True


def _segments(parts: SplitResult) -> list[str]:
    return [unquote(s) for s in parts.path.split("/") if s]


def _origin(parts: SplitResult) -> tuple[str, str, int | None]:
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)


def under_prefix(value: str, prefix: str) -> bool:
    """`value` lies under `prefix`: same scheme, host and port, and the prefix's path segments
    are the first of the value's (no string prefix matching: hosts and segments are whole)."""
    try:
        v, p = urlsplit(value), urlsplit(prefix)
        if _origin(v) != _origin(p):
            return False
    except ValueError:  # a malformed port
        return False
    want, have = _segments(p), _segments(v)
    if any(s in (".", "..") for s in have):
        return False
    return have[: len(want)] == want


def url_refusal(value: str, prefixes: list[str]) -> str | None:
    """Why this dataset URL may not be fetched, or None when it may."""
    parts = urlsplit(value)
    if parts.scheme.lower() not in ("http", "https"):
        return f"{value!r}: only http(s) URLs under an allowed prefix, or local paths, are accepted"
    if parts.username or parts.password:
        return f"{value!r}: URLs with credentials are not accepted"
    if not any(under_prefix(value, p) for p in prefixes):
        allowed = ", ".join(prefixes) if prefixes else "none are configured"
        return (
            f"{value!r} is not under an allow-listed URL prefix ({allowed}): "
            "put the file under a data root or ask the operator to allow its prefix"
        )
    host = parts.hostname or ""
    if not host or not is_public(host):
        return (
            f"{value!r}: the host {host!r} is a private, loopback or link-local address "
            "(or does not resolve); only public hosts may be fetched"
        )
    return None


class RefusedURL(ValueError):
    pass


def fetch_url(value: str, prefixes: list[str], dest: Path, timeout: float = 60.0) -> Path:
    """Download `value` into the directory `dest` and return the file. Each hop is checked with
    `url_refusal` right before it is requested (its host resolved again), and redirects are
    followed by hand, each target checked the same way, at most MAX_REDIRECTS of them."""
    import httpx

    url = value
    with httpx.Client(follow_redirects=False, timeout=timeout, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            if (why := url_refusal(url, prefixes)) is not None:
                raise RefusedURL(why if url == value else f"redirected from {value!r} to a refused URL: {why}")
            with client.stream("GET", url) as resp:
                if resp.is_redirect:
                    url = urljoin(url, resp.headers["location"])
                    continue
                resp.raise_for_status()
                dest.mkdir(parents=True, exist_ok=True)
                name = re.sub(r"[^A-Za-z0-9._-]", "_", (_segments(urlsplit(url)) or [""])[-1]).lstrip(".")
                path = dest / (name or "data.jsonl")  # keeps the extension, which picks the format
                with path.open("wb") as f:
                    for chunk in resp.iter_bytes():
                        f.write(chunk)
                return path
    raise RefusedURL(f"{value!r}: more than {MAX_REDIRECTS} redirects")
