"""Random, time-ordered ids (UUIDv7, RFC 9562): unguessable in URLs and sortable for cursors.

Within one process ids are strictly increasing (a 12-bit counter fills rand_a inside a
millisecond), so rows written in order page back in order.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> str:
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            _counter += 1
            if _counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        else:
            _last_ms, _counter = ms, int.from_bytes(os.urandom(1), "big")  # random start, room to count
        counter = _counter
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand_b
    return str(uuid.UUID(int=value))
