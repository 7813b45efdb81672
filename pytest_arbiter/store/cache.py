"""The MeasureCache: winners by key, and the cache format, ``pytest-arbiter/cache``.

The format's classes live in :mod:`pytest_arbiter.store.entry` (an entry) and
:mod:`pytest_arbiter.store.tables` (what entries share); the names callers use are
importable from here. docs/artifacts.md describes the file.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from pytest_arbiter.store.cache_lazy import LazyEntries

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
    :attr:`changed`, which tells the arbiters' plan tables of every change.

    A cache read from a file may hold its entries lazily (:meth:`of_lazy`): an entry is
    decoded and checked when its key is first looked up, and whatever walks every entry
    (``by_key``, ``entries``, iteration) decodes them all. :meth:`changes` says which
    keys were put since the cache was made, so a run finds what it measured without a
    walk.
    """

    def __init__(self, entries: Iterable[CacheEntry] = ()) -> None:
        self._entries: dict[KeyTuple, CacheEntry] = {}
        self._lazy: LazyEntries | None = None
        self._before: dict[KeyTuple, CacheEntry | None] = {}
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

    @classmethod
    def of_lazy(cls, lazy: LazyEntries) -> MeasureCache:
        """A cache of a file's entries read lazily (docs/artifacts.md: a bad entry is an
        ``ArtifactError`` when it is first looked up)."""
        cache = cls()
        cache._lazy = lazy
        return cache

    def copy(self) -> MeasureCache:
        """A cache of the same entries, changed apart from this one from now on (an
        entry of a lazy file is decoded once for both)."""
        with self._lock:
            copied = type(self).of_keyed(dict(self._entries))
            copied._lazy = self._lazy
        return copied

    def _all(self) -> dict[KeyTuple, CacheEntry]:
        """Every entry by key, the lazy ones decoded (the caller holds the lock)."""
        lazy = self._lazy
        if lazy is not None:
            every = lazy.all()
            every.update(self._entries)
            self._entries, self._lazy = every, None
        return self._entries

    def by_key(self) -> dict[KeyTuple, CacheEntry]:
        """A snapshot of the entries by key (a new dict)."""
        with self._lock:
            return dict(self._all())

    def get(self, key: KeyTuple) -> CacheEntry | None:
        """The entry of ``key`` (a :class:`CacheKey`, or a plain tuple in its order)."""
        # the lazy part first: a walk on another thread moves its entries into
        # _entries and then drops it, so read in the other order, one could miss both
        lazy = self._lazy
        found = self._entries.get(key)
        if found is None and lazy is not None:
            found = lazy.entry(key)
        return found

    def _record(self, key: KeyTuple) -> None:
        """Note the entry ``key`` holds before its first change (caller holds the lock)."""
        if key not in self._before:
            held = self._entries.get(key)
            if held is None and self._lazy is not None:
                held = self._lazy.decoded(key)
            self._before[key] = held

    def put(self, entry: CacheEntry) -> None:
        key = plain_key(entry)
        with self._lock:
            self._record(key)
            self._entries[key] = entry
            self.version += 1
        self.changed.fire()

    def clear(self) -> None:
        """Remove every entry."""
        with self._lock:
            self._entries, self._lazy, self._before = {}, None, {}
            self.version += 1
        self.changed.fire()

    def update(self, entries: Iterable[CacheEntry]) -> None:
        with self._lock:
            for entry in entries:
                key = plain_key(entry)
                self._record(key)
                self._entries[key] = entry
            self.version += 1
        self.changed.fire()

    def changes(self) -> dict[KeyTuple, CacheEntry | None]:
        """Each key put (or updated) since the cache was made or cleared, in the order
        first put, with the entry it held before (``None``: none, or a lazy file's entry
        never looked up): what a run measured is the keys whose entry is another now."""
        with self._lock:
            return dict(self._before)

    def devices(self) -> set[str]:
        """The device tags of the entries' keys (no entry decoded)."""
        with self._lock:
            found = set(map(itemgetter(0), self._entries))
            if self._lazy is not None:
                found |= self._lazy.devices()
        return found

    def entries(self) -> list[CacheEntry]:
        """Every entry, sorted by key."""
        with self._lock:
            every = self._all()
            return [every[k] for k in sorted(every)]

    def __iter__(self) -> Iterator[CacheEntry]:
        """Every entry, in no particular order (a snapshot: cheaper than entries())."""
        with self._lock:
            return iter(list(self._all().values()))

    def __len__(self) -> int:
        with self._lock:
            lazy = self._lazy
            if lazy is None:
                return len(self._entries)
            return len(lazy) + sum(1 for key in self._entries if key not in lazy)

    def __contains__(self, key: object) -> bool:
        lazy = self._lazy
        return key in self._entries or (lazy is not None and key in lazy)
