"""Errors the SDK's own checks raise, importable by every module that raises them."""

from __future__ import annotations


class FieldError(ValueError):
    """A cross-field error that knows which field to blame (the API's problem details point at it)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
