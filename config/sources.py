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
import os
import re
import socket
from pathlib import Path
from urllib.parse import SplitResult, unquote, urljoin, urlsplit

from runtime.errors import RefusedURL as RefusedURL  # raised here; its callers import it from here

MAX_REDIRECTS = 5


def storage_dirs(artifact_dir: str, cache_dirs: list[str]) -> list[Path]:
    """What a raw path may never reach, whatever the roots say: the artifact directory (every
    project's trained models, checkpoints, results and uploaded files) and the model caches, this
    process's (HF_HOME) and the workers' (`sources.cache_dirs`: every project's hub downloads and
    prepared datasets). Those are reached by typed references only ('job:<id>', 'ft:...',
    'file-...'), which are checked against the caller's project. Checked by the API at submit
    (api/admission.py) and by the job process before it loads (worker/child.py), on its own view."""
    cache = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return [Path(d).expanduser().resolve() for d in (artifact_dir, cache, *cache_dirs) if d]


def local_path(value: str) -> str | None:
    """The local file a source names (an absolute path, or a file:// URL's path), or None where it
    names none (a hub id, an http(s) URL, a 'job:' reference)."""
    if value.startswith("file:"):
        return unquote(urlsplit(value).path)
    return value if value.startswith(("/", "~")) else None


_DEFAULT_PORTS = {"http": 80, "https": 443}


# IPv6 forms that carry an IPv4 address, which is what a connection to them reaches
_V4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # ::a.b.c.d (deprecated; :: and ::1 too)
_V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")  # ::ffff:a.b.c.d
_V4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")  # ::ffff:0:a.b.c.d (SIIT, RFC 2765)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # well-known NAT64 prefix (RFC 6052)
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # local-use NAT64 (RFC 8215): never public
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")  # 6to4: the IPv4 in bits 16-47
_TEREDO = ipaddress.IPv6Network("2001::/32")  # Teredo: server in bits 32-63, client XOR-ed in 96-127


def carried_ipv4(addr: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address] | None:
    """The IPv4 addresses an IPv6 address carries (and reaches), or None for a plain IPv6 one."""
    low = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr in _V4_COMPATIBLE or addr in _V4_MAPPED or addr in _V4_TRANSLATED or addr in _NAT64:
        return [low]
    if addr in _SIX_TO_FOUR and addr.sixtofour is not None:
        return [addr.sixtofour]
    if addr in _TEREDO and addr.teredo is not None:
        return list(addr.teredo)  # (server, client): both take part in the exchange
    return None


def public_address(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """A global unicast address; an IPv6 form of an IPv4 address is judged by the IPv4 one(s)."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr in _NAT64_LOCAL:  # where the IPv4 sits depends on the operator's prefix length
            return False
        carried = carried_ipv4(addr)
        if carried is not None:
            return all(public_address(v4) for v4 in carried)
    return addr.is_global and not addr.is_multicast


def is_public(host: str) -> bool:
    """True when every address the host names is public (not private/loopback/link-local/...),
    IPv4 addresses embedded in IPv6 ones (mapped, compatible, NAT64, 6to4, Teredo) included."""
    try:
        addresses = [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            return False
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    return bool(addresses) and all(public_address(addr) for addr in addresses)


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
