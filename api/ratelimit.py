"""Rate limits, as token buckets in each API process (`take`, `enforce`): one per API key, one per
project (its keys together), and one per client address for the requests that come without a valid
key (`enforce_address`), which would otherwise be answered 401 as fast as they came.

With N API processes a key can make up to N x the rate. Routes without a key (health, metrics), the
operator's admin token, and a valid key by its address are not limited. X-Forwarded-For is believed
only from the proxies the operator lists (settings.trusted_proxies; default none, not even
loopback). What each limit promises, and why: RELIABILITY.md, "Abuse"."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from api.problems import Problem

RATE_LIMITED = "Too many requests with this API key: slow down and retry after the number of seconds in Retry-After."
PROJECT_LIMITED = (
    "Too many requests across your project's API keys (they share one rate): slow down and retry after the "
    "number of seconds in Retry-After."
)
ADDRESS_LIMITED = (
    "Too many requests without a valid API key from this address: send a valid key "
    "('Authorization: Bearer <key>'), or retry after the number of seconds in Retry-After."
)

# bucket name -> (tokens, monotonic time of the last refill), least recently used first; the
# address buckets apart, so that requests from many addresses cannot push out the keys' buckets
_buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
_addresses: OrderedDict[str, tuple[float, float]] = OrderedDict()
MAX_BUCKETS = 100_000  # each; past it, the least recently used goes (it has had the longest to refill)
_lock = threading.Lock()


def take(key_id: str, rate: float, burst: int) -> float:
    """Spend one token from the key's bucket; return 0, or the seconds until one is available.
    (Every bucket was cleared once 100,000 were held: a run of bad-key requests from as many
    addresses reset every key's and project's rate.)"""
    return _spend(key_id, rate, burst)[0]


def _spend(key_id: str, rate: float, burst: int) -> tuple[float, float]:
    """`take`'s wait, and the tokens the bucket holds after it: one pass under the lock."""
    now = time.monotonic()
    buckets = _addresses if key_id.startswith("address:") else _buckets
    with _lock:
        tokens, last = buckets.pop(key_id, (float(burst), now))
        tokens = min(float(burst), tokens + (now - last) * rate)
        wait = 0.0 if tokens >= 1.0 else (1.0 - tokens) / rate
        left = tokens - 1.0 if wait == 0.0 else tokens
        buckets[key_id] = (left, now)
        while len(buckets) > MAX_BUCKETS:
            buckets.popitem(last=False)
        return wait, left


@dataclass(frozen=True)
class Budget:
    """What a bucket holds after a request: OpenAI's x-ratelimit-*-requests headers, which the openai
    SDK's `with_raw_response` callers read to pace themselves. The limit is the bucket's size (the
    requests a burst may make), the reset the time until it is full again."""

    limit: int
    remaining: int
    reset_seconds: float

    def headers(self) -> dict[str, str]:
        return {
            "x-ratelimit-limit-requests": str(self.limit),
            "x-ratelimit-remaining-requests": str(self.remaining),
            "x-ratelimit-reset-requests": duration(self.reset_seconds),
        }


def duration(seconds: float) -> str:
    """OpenAI's (Go's) duration text: '0s', '20ms', '1.5s', '6m0s', '1h2m3s'."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    whole = math.ceil(seconds)
    h, m, s = whole // 3600, whole // 60 % 60, whole % 60
    return (f"{h}h" if h else "") + f"{m}m{s}s"


def enforce(key_id: str, rate: float, burst: int, detail: str = RATE_LIMITED) -> Budget:
    """Spend a request from the bucket; what it holds then, or a 429 with Retry-After and the same headers."""
    wait, tokens = _spend(key_id, rate, burst)
    left = Budget(burst, max(0, math.floor(tokens)), (burst - tokens) / rate)
    if wait > 0:
        headers = {"Retry-After": str(max(1, math.ceil(wait))), **left.headers()}
        raise Problem(429, "Too many requests", detail, headers=headers)
    return left


def enforce_address(address: str, rate: float, burst: int) -> None:
    """Count a request without a valid key against its client address (a 429 past the rate)."""
    enforce(f"address:{address}", rate, burst, ADDRESS_LIMITED)


def reset() -> None:
    with _lock:
        _buckets.clear()
        _addresses.clear()
