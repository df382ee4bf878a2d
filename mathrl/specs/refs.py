"""The references a spec holds, found by their type at any depth (in unions, lists and dicts,
graders included), never by a field's name: the models it loads (fields typed ModelRef) and the
uploaded files it reads (fields typed FileRef). A new kind's `teacher: ModelRef` or `notes:
FileRef` is seen by every check that reads these: admission's path rules, the submit-time project
check, pipeline ordering, and the worker's storage re-check and file lookup."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self, TypeVar

from pydantic import BaseModel, PrivateAttr

from mathrl.fileref import names_a_file
from mathrl.modelref import names_a_model
from mathrl.specs.base import StrictModel

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class FileUse:
    """An uploaded file a spec reads: its id, and the purpose it must have (None: any)."""

    file_id: str
    purpose: str | None


class HoldsAFile(StrictModel):
    """A part of a spec with a FileRef field (at most one): the worker gives it the file's local
    path (with_file_paths), which is never part of a stored spec."""

    _path: str | None = PrivateAttr(None)

    def at_local_path(self, path: str) -> Self:
        """A copy that reads its file at `path`."""
        copy = self.model_copy()
        copy._path = path
        return copy


def model_refs(spec: BaseModel) -> dict[str, str]:
    """Every model reference in a spec, by its field path ('model', 'rewards/1/model', 'load',
    'rewards/0/grader/graders/2/grader/model', ...)."""
    out: dict[str, str] = {}

    def visit(field: Any, value: str, where: str) -> bool:
        if names_a_model(field):
            out[where] = value
            return True
        return False

    _walk(spec, "", visit)
    return out


def file_refs(spec: BaseModel) -> dict[str, FileUse]:
    """Every uploaded file a spec reads, by its field path ('dataset/file', 'eval/file', 'batch/file')."""
    out: dict[str, FileUse] = {}

    def visit(field: Any, value: str, where: str) -> bool:
        mark = names_a_file(field)
        if mark is not None:
            out[where] = FileUse(value, mark.purpose)
        return mark is not None

    _walk(spec, "", visit)
    return out


def with_file_paths(spec: M, where: Callable[[str, str], str]) -> M:
    """`spec` with each part that names an uploaded file told where it is: `where(field path, file
    id)` gives the local path (or raises); the spec itself is not changed."""
    resolved: M = _resolved(spec, "", where)
    return resolved


def _walk(value: Any, path: str, visit: Callable[[Any, str, str], bool]) -> None:
    """Calls `visit(field, text, path)` for every non-empty string field, and walks into what it
    does not take (returns False for)."""
    if isinstance(value, BaseModel):
        for name, field in type(value).model_fields.items():
            inner = getattr(value, name, None)
            at = f"{path}/{name}" if path else name
            if not (isinstance(inner, str) and inner and visit(field, inner, at)):
                _walk(inner, at, visit)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _walk(item, f"{path}/{i}", visit)
    elif isinstance(value, dict):
        for key, item in value.items():
            _walk(item, f"{path}/{key}", visit)


def _resolved(value: Any, path: str, where: Callable[[str, str], str]) -> Any:
    if isinstance(value, BaseModel):
        updates: dict[str, Any] = {}
        local: str | None = None
        for name, field in type(value).model_fields.items():
            inner = getattr(value, name, None)
            at = f"{path}/{name}" if path else name
            if isinstance(inner, str) and inner and names_a_file(field) is not None:
                local = where(at, inner)
            elif (new := _resolved(inner, at, where)) is not inner:
                updates[name] = new
        if local is None and not updates:
            return value
        copy = value.model_copy(update=updates) if updates else value
        if local is None:
            return copy
        if not isinstance(copy, HoldsAFile):
            raise TypeError(f"{type(value).__name__} has a FileRef field: make it a HoldsAFile")
        return copy.at_local_path(local)
    if isinstance(value, list):
        items = [_resolved(item, f"{path}/{i}", where) for i, item in enumerate(value)]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, dict):
        entries = {key: _resolved(item, f"{path}/{key}", where) for key, item in value.items()}
        return value if all(entries[k] is v for k, v in value.items()) else entries
    return value
