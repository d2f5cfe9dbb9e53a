"""One registry shape for every extension point: variants, policies, scenarios, figures,
peers, algorithms and engines.

A :class:`Registry` maps names to entries of one kind. It may be filled lazily: ``discover``
runs once, on the first lookup, to import the folder (or entry points) whose modules
register themselves, so adding an entry is one file and no central list. An unknown name
raises :class:`UnknownName`, one error type for every registry, which is both a KeyError
and a ValueError so that lookups written against either keep working; its message names the
kind, the name and the known names. This module imports nothing of the project, so impl/,
bench/ and analysis/ all use it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Registry", "UnknownName", "DuplicateName"]

T = TypeVar("T")


class UnknownName(KeyError, ValueError):
    """A name no entry of a registry has; ``kind``, ``name`` and ``known`` say which."""

    def __init__(self, kind: str, name, known: list[str], hint: str = ""):
        self.kind, self.name, self.known = kind, name, list(known)
        self.message = f"unknown {kind} {name!r}; known: {', '.join(self.known) or '(none)'}{hint}"
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class DuplicateName(ValueError):
    """A name registered twice (two modules claiming one name)."""


class Registry(Generic[T]):
    """Name -> entry of one ``kind`` ("variant", "engine", ...). ``discover()``, when given,
    fills it on first use (once; a failing discovery is retried on the next lookup).
    Lookups cost a dict access once discovered. Not thread-safe while discovering: fill it
    from the importing thread (module imports already serialise)."""

    def __init__(self, kind: str, discover: Callable[[], None] | None = None):
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._origins: dict[str, str] = {}
        self._discover = discover
        self._discovered = discover is None

    def _ensure(self) -> None:
        if not self._discovered:
            self._discovered = True
            try:
                self._discover()
            except BaseException:
                self._discovered = False
                raise

    def register(self, name: str, entry: T, origin: str = "") -> T:
        """Add ``entry`` as ``name``; DuplicateName when another entry has it (the same
        ``origin`` re-registering, e.g. a module imported twice, replaces it). Returns ``entry``."""
        if not isinstance(name, str) or not name or name != name.strip() or " " in name:
            raise ValueError(f"{self.kind} name must be a non-empty string without spaces, got {name!r}")
        if name in self._entries and self._origins[name] != origin:
            raise DuplicateName(f"{self.kind} name {name!r} is already registered by {self._origins[name]}")
        self._entries[name] = entry
        self._origins[name] = origin
        return entry

    def get(self, name: str) -> T:
        """The entry called ``name``; UnknownName (naming the known ones) otherwise."""
        self._ensure()
        try:
            return self._entries[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name
            raise UnknownName(self.kind, name, self.names()) from None

    def origin(self, name: str) -> str:
        self.get(name)
        return self._origins[name]

    def names(self) -> list[str]:
        """Every name, sorted."""
        self._ensure()
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) pairs in name order."""
        return [(n, self._entries[n]) for n in self.names()]

    def copy(self) -> Registry[T]:
        """An independent registry with the same entries, already discovered (tests register
        into a copy and drop it afterwards)."""
        self._ensure()
        other: Registry[T] = Registry(self.kind)
        other._entries, other._origins = dict(self._entries), dict(self._origins)
        return other

    def __contains__(self, name) -> bool:
        self._ensure()
        try:
            return name in self._entries
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._ensure()
        return len(self._entries)
