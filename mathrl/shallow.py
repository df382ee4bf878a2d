"""Free-form JSON a request may carry (a grading model's messages and sampling parameters, a dataset
item's fields), at most MAX_DEPTH levels deep: deeper, pydantic's serializer raises where the
service stores it (at 255 levels, a 500), and nothing a grader reads nests so far."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator

MAX_DEPTH = 32


def shallow(value: Any) -> Any:
    """`value`, or a ValueError where it nests deeper than MAX_DEPTH (counted without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > MAX_DEPTH:
                    raise ValueError(f"nests deeper than {MAX_DEPTH} levels: flatten it")
                stack.append((child, depth + 1))
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(shallow)]
