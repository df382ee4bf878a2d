"""One registry type for everything looked up by name: job kinds, benchmarks, recipes, graders'
scorers, generation backends. An unknown name raises the registry's error, naming the close
names (did you mean) and every known one."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

from mathrl.errors import UnknownName as UnknownName  # raised here; its callers import it from here

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Entries by name; `registry[name]` of an unknown name raises `error` (UnknownName, or a
    registry's own subclass of it) with the close names."""

    def __init__(self, what: str, error: type[UnknownName] = UnknownName) -> None:
        self.what = what
        self.error = error
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator: `@registry.register("name")` adds the decorated object."""

        def add(entry: T) -> T:
            return self.add(name, entry)

        return add

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self._entries), n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            known = ", ".join(sorted(self._entries))
            raise self.error(f"unknown {self.what} {name!r}.{hint} Known: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str, default: T | None = None) -> T | None:  # type: ignore[override]  # no KeyError to catch
        return self._entries.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
