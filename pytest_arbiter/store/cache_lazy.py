"""A cache file's entries read lazily: each entry's JSON kept as it lies in the file,
decoded and checked the first time its key is looked up.

A run that dispatches a few keys of a big corpus decodes those few: reading the file
costs a scan of its JSON (in C, no object per field) and an index by key, not a
:class:`~pytest_arbiter.store.entry.CacheEntry` per entry. What walks every entry (a
full write, ``by_key``) decodes the rest in one pass, as an eager read does. A bad entry
is an ``ArtifactError`` naming the file and the entry's JSON path, raised where the
entry is first needed. :func:`pytest_arbiter.store.cache_file.lazy_entries` reads a file
into one.
"""

from __future__ import annotations

import threading
from operator import itemgetter
from typing import Any

import msgspec

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.store.entry import BadEntry, CacheEntry, KeyTuple, finish_read
from pytest_arbiter.store.safetext import escape
from pytest_arbiter.store.tables import _message, _read_tables, _Tables

_ONE = msgspec.json.Decoder(CacheEntry)
_ALL = msgspec.json.Decoder(list[CacheEntry])


class LazyEntries:
    """The entries of one file (its ``entries`` array, ``array``; each entry's JSON,
    ``raws``, and its key, ``keys``, in the file's order, one entry a key), decoded
    against the file's ``tables`` when first asked for; thread-safe."""

    def __init__(self, source: str, tables: _Tables, array: Any, raws: list[msgspec.Raw],
                 keys: list[KeyTuple]) -> None:
        self.source = source
        self.tables = tables
        self.keys = keys
        """Every key, in the file's order."""
        self.index = dict(zip(keys, range(len(keys)), strict=True))
        """Each key's place in the file."""
        self._array = array
        self._raws = raws
        self._decoded: dict[KeyTuple, CacheEntry] = {}
        self._lock = threading.Lock()
        self._devices: set[str] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, key: object) -> bool:
        return key in self.index

    def entry(self, key: KeyTuple) -> CacheEntry | None:
        """The entry of ``key`` (``None``: the file has none), decoded and checked the
        first time; ``ArtifactError`` if it is not a valid entry."""
        found = self._decoded.get(key)
        if found is not None:
            return found
        at = self.index.get(key)
        if at is None:
            return None
        with self._lock:
            found = self._decoded.get(key)
            if found is None:
                found = self._decoded[key] = self._decode(at)
        return found

    def decoded(self, key: KeyTuple) -> CacheEntry | None:
        """The entry of ``key`` if it was decoded already (none is decoded now)."""
        return self._decoded.get(key)

    def devices(self) -> set[str]:
        """The device tags of the keys."""
        if self._devices is None:
            self._devices = set(map(itemgetter(0), self.keys))
        return set(self._devices)

    def all(self) -> dict[KeyTuple, CacheEntry]:
        """Every entry by key (a new dict), the ones not decoded yet decoded in one pass;
        ``ArtifactError`` naming the first bad entry."""
        with self._lock:
            if len(self._decoded) < len(self.keys):
                fresh = dict(zip(self.keys, self._decode_all(), strict=True))
                fresh.update(self._decoded)  # an entry handed out stays the one object
                self._decoded = fresh
            return dict(self._decoded)

    def _decode(self, at: int) -> CacheEntry:
        tables = self.tables
        tables.pending = []  # what a failed decode left behind is not this entry's
        raw = self._raws[at]
        try:
            entry: CacheEntry = _read_tables(lambda: _ONE.decode(raw), tables)
            finish_read([entry], tables)
        except msgspec.ValidationError as exc:
            raise self._error(_entry_path(_message(exc), at)) from None
        except BadEntry as exc:
            raise self._error(BadEntry(at, exc.detail, exc.at).path()) from None
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise self._error(_entry_path(f"not a valid entry: {exc}", at)) from None
        return entry

    def _decode_all(self) -> list[CacheEntry]:
        tables = self.tables
        tables.pending = []  # what a failed decode left behind is not this pass's
        try:
            entries: list[CacheEntry] = _read_tables(lambda: _ALL.decode(self._array),
                                                     tables)
            finish_read(entries, tables)
        except msgspec.ValidationError as exc:
            raise self._error(_message(exc).replace(" - at `$[", " - at `$.entries[", 1)
                              ) from None
        except BadEntry as exc:
            raise self._error(exc.path()) from None
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise self._error(f"not a valid cache file: {exc}") from None
        return entries

    def _error(self, what: str) -> ArtifactError:
        return ArtifactError(f"{escape(self.source)}: {escape(what)}")


def _entry_path(message: str, at: int) -> str:
    """msgspec's message about one entry decoded alone, its path under the file's
    ``$.entries[at]``."""
    mark = " - at `$"
    if mark in message:
        return message.replace(mark, f"{mark}.entries[{at}]", 1)
    return f"{message} - at `$.entries[{at}]`"
