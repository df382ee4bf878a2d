"""The references a spec holds, found by their type at any depth (in unions, lists and dicts,
graders included), never by a field's name: the models it loads (fields typed ModelRef) and the
uploaded files it reads (fields typed FileRef). A new kind's `teacher: ModelRef` or `notes:
FileRef` is seen by every check that reads these: admission's path rules, the submit-time project
check, pipeline ordering, and the worker's storage re-check and file lookup."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
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
    id)` gives the local path (or raises); the spec itself is not changed. The parts are the ones
    `file_refs` finds, each rebuilt along its path."""
    out: M = spec
    for at, use in file_refs(spec).items():
        local = where(at, use.file_id)
        out = _replaced(out, at.split("/")[:-1], partial(_told, local=local))
    return out


def _told(holder: Any, local: str) -> Any:
    if not isinstance(holder, HoldsAFile):
        raise TypeError(f"{type(holder).__name__} has a FileRef field: make it a HoldsAFile")
    return holder.at_local_path(local)


def _replaced(value: Any, steps: list[str], change: Callable[[Any], Any]) -> Any:
    """A copy of `value` with what lies at `steps` (a field path's parts) changed; the rest is shared."""
    if not steps:
        return change(value)
    step, rest = steps[0], steps[1:]
    if isinstance(value, BaseModel):
        return value.model_copy(update={step: _replaced(getattr(value, step), rest, change)})
    if isinstance(value, list | tuple):
        items = list(value)
        items[int(step)] = _replaced(items[int(step)], rest, change)
        return type(value)(items)
    return {**value, step: _replaced(value[step], rest, change)}


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
