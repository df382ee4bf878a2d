"""The mark a pydantic field's type carries, found in its metadata or inside its annotation,
alone, in a union (`ModelRef | None`) or nested in `Annotated`: how `names_a_model`
(mathrl.modelref) and `names_a_file` (mathrl.fileref) tell a reference field by its type."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, get_args, get_origin


def field_mark(field: Any, is_mark: Callable[[Any], bool]) -> Any | None:
    """The first metadata item of a field (its FieldInfo) that `is_mark`, or None."""
    for meta in getattr(field, "metadata", ()):
        if is_mark(meta):
            return meta
    return _mark_in(getattr(field, "annotation", None), is_mark)


def _mark_in(annotation: Any, is_mark: Callable[[Any], bool]) -> Any | None:
    if get_origin(annotation) is Annotated:
        marks = [m for m in annotation.__metadata__ if is_mark(m)]
        return marks[0] if marks else _mark_in(get_args(annotation)[0], is_mark)
    for arg in get_args(annotation):
        if (mark := _mark_in(arg, is_mark)) is not None:
            return mark
    return None
