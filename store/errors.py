"""The store's own errors, on the project's base (mathrl.errors.MathRLException): what the store
refuses to write. The API answers each as a 4xx; an SDK user meets them only as that answer."""

from __future__ import annotations

from mathrl.errors import UNSTORABLE, MathRLException


class Unstorable(MathRLException, ValueError):
    """A value no JSON column may hold: a NUL character (`pointer`: where, in the document). PostgreSQL
    keeps the escape in a json column, and then every query that reads that row as text fails
    ('unsupported Unicode escape sequence'). The API answers it as a 422 at that pointer."""

    def __init__(self, pointer: str):
        self.pointer = pointer or "/"
        super().__init__(f"{self.pointer}: {UNSTORABLE}")


class NotPausable(MathRLException, ValueError):
    """The job is not in a status a pause or a resume applies to (the message says which)."""


class OverQuota(MathRLException, ValueError):
    """Storing a file would take its project past its storage (store/files.py): `what` is 'files'
    (their number, `count` stored) or 'bytes' (`used` with the new one, over `max_bytes`)."""

    def __init__(self, what: str, count: int, used: int, max_bytes: int) -> None:
        self.what, self.count, self.used, self.max_bytes = what, count, used, max_bytes
        super().__init__(
            f"the project stores {count} files, the limit"
            if what == "files"
            else f"the project's files would take {used} bytes, over its {max_bytes}"
        )
