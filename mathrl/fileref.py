"""An uploaded file in a spec: the id ('file-<32 hex>') of a file of the job's project (POST /v1/files).

A field that holds one is typed `FileRef`, or `Annotated[str, NamesAFile(purpose), ...]` for a file of
one purpose (mathrl/specs/generate.py `BatchFileRef`); mathrl.specs.file_refs
finds every such field by its type, at any depth, for the submit-time project check and the worker's
lookup of where the file is (mathrl.specs.refs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from mathrl.marks import field_mark

FILE_ID_PATTERN = r"^file-[0-9a-f]{32}$"


@dataclass(frozen=True)
class NamesAFile:
    """The mark a FileRef carries: the purpose its file must have (None: any)."""

    purpose: str | None = None


# a field naming an uploaded file of any purpose; its description goes in the field's own Field(...)
FileRef = Annotated[str, NamesAFile(), Field(pattern=FILE_ID_PATTERN)]


def names_a_file(field: Any) -> NamesAFile | None:
    """The mark of a pydantic field (its FieldInfo) typed FileRef, alone or in a union (`FileRef |
    None`); None for any other field."""
    mark: NamesAFile | None = field_mark(field, lambda meta: isinstance(meta, NamesAFile))
    return mark
