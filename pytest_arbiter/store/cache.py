"""The MeasureCache: winners by key, and the cache format, ``pytest-arbiter/cache``.

The format's classes live in :mod:`pytest_arbiter.store.entry` (an entry) and
:mod:`pytest_arbiter.store.tables` (what entries share); the names callers use are
importable from here. docs/artifacts.md describes the file.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

from pytest_arbiter.core.changes import Listeners
from pytest_arbiter.store.entry import (
    CONFIDENT,
    MIN_ROUNDS,
    NO_SINCE,
    PROVENANCE_KEYS,
    CacheEntry,
    CacheKey,
    KeyTuple,
    Provenance,
    RankedCandidate,
    plain_key,
    shapes_text,
    since_for,
    utc_now,
)
from pytest_arbiter.store.tables import RETRIED, ROW_OUTCOMES, Considered, RowOutcome

__all__ = [
    "CACHE_SCHEMA",
    "CACHE_VERSION",
    "CONFIDENT",
    "MIN_ROUNDS",
    "NO_SINCE",
    "PROVENANCE_KEYS",
    "RETRIED",
    "ROW_OUTCOMES",
    "CacheEntry",
    "CacheKey",
    "Considered",
    "KeyTuple",
    "MeasureCache",
    "Provenance",
    "RankedCandidate",
    "RowOutcome",
    "plain_key",
    "shapes_text",
    "since_for",
    "utc_now",
]


CACHE_SCHEMA = "pytest-arbiter/cache"
CACHE_VERSION = 3
"""Version 3: entries are objects with named fields, shared data in tables."""


class MeasureCache:
    """Winners by key; O(1) lookups, thread-safe updates, a version counter, and
    :attr:`changed`, which tells the arbiters' plan tables of every change."""

    def __init__(self, entries: Iterable[CacheEntry] = ()) -> None:
        self._entries: dict[KeyTuple, CacheEntry] = {}
        self._lock = threading.Lock()
        self.version = 0
        self.changed = Listeners()
        for entry in entries:
            self._entries[plain_key(entry)] = entry

    @classmethod
    def of_keyed(cls, by_key: dict[KeyTuple, CacheEntry]) -> MeasureCache:
        """A cache that takes ``by_key`` over; each value's ``key`` must be its key."""
        cache = cls()
        cache._entries = by_key
        return cache

    def by_key(self) -> dict[KeyTuple, CacheEntry]:
        """A snapshot of the entries by key (a new dict)."""
        with self._lock:
            return dict(self._entries)

    def get(self, key: KeyTuple) -> CacheEntry | None:
        """The entry of ``key`` (a :class:`CacheKey`, or a plain tuple in its order)."""
        return self._entries.get(key)

    def put(self, entry: CacheEntry) -> None:
        with self._lock:
            self._entries[plain_key(entry)] = entry
            self.version += 1
        self.changed.fire()

    def clear(self) -> None:
        """Remove every entry."""
        with self._lock:
            self._entries = {}
            self.version += 1
        self.changed.fire()

    def update(self, entries: Iterable[CacheEntry]) -> None:
        with self._lock:
            for entry in entries:
                self._entries[plain_key(entry)] = entry
            self.version += 1
        self.changed.fire()

    def entries(self) -> list[CacheEntry]:
        """Every entry, sorted by key."""
        with self._lock:
            return [self._entries[k] for k in sorted(self._entries)]

    def __iter__(self) -> Iterator[CacheEntry]:
        """Every entry, in no particular order (a snapshot: cheaper than entries())."""
        with self._lock:
            return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
