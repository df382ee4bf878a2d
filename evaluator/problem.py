"""One benchmark or training problem, as every loader (files, hub sets, synthetic ones) returns it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Problem:
    index: int
    question: str
    gold: str
    meta: dict[str, Any] = field(default_factory=dict)
    solution: str | None = None
