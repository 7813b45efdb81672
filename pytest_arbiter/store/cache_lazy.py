"""A cache file's entries read lazily: each entry's JSON kept as it lies in the file,
decoded and checked the first time its key is looked up.

A file in the writer's layout (one entry a line, sorted by key, each key once:
:func:`~pytest_arbiter.store.cache_file.lazy_entries` checks it with one decode of
every key, else the file is read whole) is read as its bytes and an
:class:`EntryLines` over them: a lookup is a binary search over byte offsets that
decodes the key of each line it lands on (a few dozen for a big corpus), not a table
of every key. Each line a search reads must still be one whole entry in key order with
the lines around it; one that is not turns the cache to the slow road, every key
decoded (:class:`_KeyIndex`), a key listed twice resolved by the merge rule. An entry
no lookup reads is never decoded: a damaged one stays as it lies.

What walks every entry (a full write, ``by_key``) decodes the rest in one pass, as an
eager read does. A bad entry is an ``ArtifactError`` naming the file and the entry's
JSON path, raised where the entry is first needed.
:func:`pytest_arbiter.store.cache_file.lazy_entries` reads a file into one.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import Any

import msgspec
from msgspec import Struct

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.store.entry import BadEntry, CacheEntry, KeyTuple, finish_read, plain_key
from pytest_arbiter.store.safetext import escape
from pytest_arbiter.store.tables import _message, _read_tables, _Tables

_ONE = msgspec.json.Decoder(CacheEntry)
_ALL = msgspec.json.Decoder(list[CacheEntry])
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_WHOLE = msgspec.json.Decoder(msgspec.Raw)
_BREAK = b"\n    "
"""A line break between two entries and the indent after it (a comma before it)."""
_COUNT_BLOCK = 1 << 20
"""Bytes counted at a time for the line count (a block's flags stay in the CPU cache)."""


class _Key(Struct, frozen=True, gc=False):
    """The key fields of an entry, the rest skipped."""

    device: str
    target: str
    op: str
    bucket: str
    dtype: str


_KEY = msgspec.json.Decoder(_Key)
_KEYS = msgspec.json.Decoder(list[_Key])


Resolve = Callable[[list[CacheEntry]], Mapping[KeyTuple, CacheEntry]]
"""The entries of a list that holds a key twice, by key (the merge rule)."""


class Broken(Exception):
    """A line a search read is not one whole entry in key order (not the writer's
    layout): the caller reads the file another way."""


class EntryLines:
    """The entry lines of a file in the writer's layout, found in its bytes ``data``:
    the first starts at ``begin``, the last ends at ``end`` (where the file's tail
    starts); a line is named by the offset it starts at. Only the lines a search lands
    on are decoded (their keys, kept); :attr:`broken` once one was not as the layout
    says, and from then on every search raises :class:`Broken`."""

    def __init__(self, data: bytes, begin: int, end: int) -> None:
        self.data = data
        self.begin = begin
        self.end = end
        self.past = end + len(_BREAK)
        """Where a line after the last would start: a search for a key past them all."""
        self.broken = False
        self._keys: dict[int, tuple[KeyTuple, int]] = {}
        self._count: int | None = None

    def __len__(self) -> int:
        """How many lines (one per line break, and the last)."""
        if self._count is None:
            self._count = _count_breaks(self.data, self.begin, self.end) + 1
        return self._count

    def key(self, start: int) -> KeyTuple:
        """The key of the line at ``start`` (a line start), decoded the first time."""
        return self._line(start)[0]

    def stop(self, start: int) -> int:
        """Where the entry of the line at ``start`` ends (before its comma)."""
        return self._line(start)[1]

    def next(self, start: int) -> int:
        """Where the line after the one at ``start`` starts (:attr:`past` after the
        last)."""
        stop = self._line(start)[1]
        return self.past if stop == self.end else stop + 1 + len(_BREAK)

    def raw(self, start: int) -> memoryview:
        """The JSON of the entry at ``start``."""
        return memoryview(self.data)[start:self.stop(start)]

    def keys_read(self) -> list[KeyTuple]:
        """The keys of the lines read so far."""
        return [key for key, _ in self._keys.values()]

    def index(self, start: int) -> int:
        """The place in the file's entries of the line at ``start`` (a count of the
        line breaks before it: for messages)."""
        return self.data.count(b"\n", self.begin, start)

    def locate(self, key: tuple[str, ...]) -> int:
        """The start of the first line whose key is not below ``key`` (:attr:`past` if
        none): a binary search over byte offsets. Each line it reads must lie between
        the lines it read before, in key order: :class:`Broken` if one does not."""
        if self.broken:
            raise Broken
        data, lo, hi = self.data, self.begin, self.past
        low: KeyTuple | None = None  # the key of the line before lo, if read
        high: KeyTuple | None = None  # the key of the line at hi, if read
        while lo < hi:
            # a line start in [lo, hi): the first after the midpoint, else the last before
            mid, last_break = (lo + hi) // 2, hi - len(_BREAK)
            found = data.find(b"\n", mid, last_break) if mid < last_break else -1
            if found < 0:
                found = data.rfind(b"\n", lo, min(mid, last_break))
            at = lo if found < 0 else found + len(_BREAK)
            seen = self.key(at)
            if (low is not None and not low < seen) or (high is not None
                                                       and not seen < high):
                self.broken = True
                raise Broken
            if seen < key:
                lo, low = self.next(at), seen
            else:
                hi, high = at, seen
        return lo

    def place(self, key: KeyTuple) -> tuple[int, bool]:
        """The start of the line of ``key`` and ``True``, else where its line would go
        (:meth:`locate`) and ``False``; :class:`Broken` as :meth:`locate` says, or if
        the line after that one is not after it in key order (two lines swapped, a key
        listed twice)."""
        at = self.locate(key)
        if at == self.past:
            return at, False
        after = self.next(at)
        if after != self.past and not self.key(at) < self.key(after):
            self.broken = True
            raise Broken
        return at, self.key(at) == key

    def find(self, key: KeyTuple) -> int | None:
        """The start of the line of ``key``; ``None`` if the file has none."""
        at, holds = self.place(key)
        return at if holds else None

    def devices(self) -> set[str]:
        """The device tags of the keys: the first line's, then a search past each."""
        found: set[str] = set()
        at = self.begin
        while at != self.past:
            device = self.key(at)[0]
            found.add(device)
            at = self.locate((device + "\0",))  # past every key of this device
        return found

    def _line(self, start: int) -> tuple[KeyTuple, int]:
        held = self._keys.get(start)
        if held is not None:
            return held
        data = self.data
        stop = data.find(b"\n", start, self.end)
        if start != self.begin and not data.startswith(_BREAK, start - len(_BREAK)):
            self.broken = True  # not after a line break
            raise Broken
        if stop < 0:
            stop = self.end
        elif data[stop - 1] != 0x2C or not data.startswith(_BREAK, stop):  # a comma
            self.broken = True
            raise Broken
        else:
            stop -= 1
        try:  # the whole line must be one entry's object
            key = _KEY.decode(memoryview(data)[start:stop])
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            self.broken = True
            raise Broken from None
        held = self._keys[start] = (msgspec.structs.astuple(key), stop)
        return held


def _count_breaks(data: bytes, begin: int, end: int) -> int:
    """The line breaks in ``data[begin:end]``, counted a block at a time with NumPy (a
    quarter of ``bytes.count``'s time)."""
    import numpy as np

    whole = np.frombuffer(data, np.uint8)
    flags = np.empty(_COUNT_BLOCK, bool)
    found = 0
    for at in range(begin, end, _COUNT_BLOCK):
        block = whole[at:min(at + _COUNT_BLOCK, end)]
        np.equal(block, 0x0A, out=flags[:len(block)])
        found += int(np.count_nonzero(flags[:len(block)]))
    return found


class _KeyIndex:
    """Every entry's key decoded and its JSON found (the slow road: a file that is not
    one entry a line in key order); ``unique``: no key is listed twice."""

    def __init__(self, array: Any) -> None:
        self.raws: list[msgspec.Raw] = _RAWS.decode(array)
        self.keys: list[KeyTuple] = list(map(msgspec.structs.astuple, _KEYS.decode(array)))
        self.at = dict(zip(self.keys, range(len(self.keys)), strict=True))
        self.unique = len(self.at) == len(self.keys)


class LazyEntries:
    """The entries of one file (its ``entries`` array, ``array``), found through its
    ``lines`` while they are as the writer's layout says (else through every key
    decoded), decoded against the file's ``tables`` when first asked for;
    thread-safe. ``resolve`` gives the entries of a list that holds a key twice by key
    (the merge rule: :func:`pytest_arbiter.store.corpus.merge`)."""

    def __init__(self, source: str, tables: _Tables, array: Any, lines: EntryLines,
                 resolve: Resolve) -> None:
        self.source = source
        self._resolve = resolve
        self.tables = tables
        self.lines: EntryLines | None = lines
        """The file's lines while every line read was as the layout says (a splice
        writes through them), else ``None``."""
        self._array = array
        self._keys: _KeyIndex | None = None
        self._failure: ArtifactError | None = None
        self._decoded: dict[KeyTuple, CacheEntry] = {}
        self._complete = False  # every entry is in _decoded (a key listed twice)
        self._lock = threading.Lock()
        self._devices: set[str] | None = None

    def __len__(self) -> int:
        with self._lock:
            if self._complete:
                return len(self._decoded)
            if self.lines is not None:
                return len(self.lines)
            assert self._keys is not None
            return len(self._keys.keys)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple):
            return False
        with self._lock:
            return self._where(key) is not None or key in self._decoded

    def entry(self, key: KeyTuple) -> CacheEntry | None:
        """The entry of ``key`` (``None``: the file has none), decoded and checked the
        first time; ``ArtifactError`` if it is not a valid entry."""
        found = self._decoded.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._decoded.get(key)
            if found is None:
                where = self._where(key)
                found = self._decoded.get(key)  # the slow road may have decoded them all
                if found is None and where is not None:
                    found = self._decoded[key] = self._decode(*where)
        return found

    def decoded(self, key: KeyTuple) -> CacheEntry | None:
        """The entry of ``key`` if it was decoded already (none is decoded now)."""
        return self._decoded.get(key)

    def devices(self) -> set[str]:
        """The device tags of the keys (never an error: of a file whose keys cannot all
        be read, the tags of the keys read)."""
        with self._lock:
            if self._devices is None:
                self._devices = self._find_devices()
            return set(self._devices)

    def all(self) -> dict[KeyTuple, CacheEntry]:
        """Every entry by key (a new dict), the ones not decoded yet decoded in one pass
        (a key listed twice: the entry the merge rule prefers); ``ArtifactError`` naming
        the first bad entry."""
        with self._lock:
            if not self._complete:
                self._complete_all()
            return dict(self._decoded)

    def _where(self, key: Any) -> tuple[Callable[[], int], Any] | None:
        """Where the JSON of ``key``'s entry lies: what gives its place in the file's
        entries (counted only for a message) and the JSON (``None``: no entry; the
        caller holds the lock)."""
        if self._complete:
            return None  # every entry is decoded: the caller looked there
        if self.lines is not None:
            try:
                at = self.lines.find(key)
            except Broken:
                self._slow_road()
            else:
                if at is None:
                    return None
                return functools.partial(self.lines.index, at), self.lines.raw(at)
        if self._complete:
            return None
        keys = self._slow_keys()
        found = keys.at.get(key)
        return None if found is None else (functools.partial(int, found), keys.raws[found])

    def _find_devices(self) -> set[str]:
        lines = self.lines
        read = set(map(itemgetter(0), self._decoded))
        try:
            if lines is not None and not self._complete:
                read |= {key[0] for key in lines.keys_read()}
                try:
                    return lines.devices()
                except Broken:
                    self._slow_road()
            if not self._complete:
                return set(map(itemgetter(0), self._slow_keys().keys))
        except ArtifactError:
            return read
        return set(map(itemgetter(0), self._decoded))

    def _slow_road(self) -> None:
        """Leave the lines for every key decoded: a line read was not as the layout
        says (the caller holds the lock)."""
        self.lines = None
        self._devices = None
        keys = self._slow_keys()
        if not keys.unique:  # a key listed twice: the merge rule picks, as a full read
            try:
                self._complete_all()
            except ArtifactError as exc:  # never a lookup past the merge rule: this error
                self._keys, self._failure = None, exc
                raise

    def _slow_keys(self) -> _KeyIndex:
        """Every key decoded; ``ArtifactError`` (the same one each time) if the
        entries are not an array of objects with a key of five strings."""
        if self._keys is None:
            if self._failure is not None:
                raise self._failure
            try:
                self._keys = _KeyIndex(self._array)
            except msgspec.ValidationError as exc:
                self._failure = self._error(
                    _message(exc).replace(" - at `$[", " - at `$.entries[", 1))
            except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
                self._failure = self._unreadable()
            if self._failure is not None:
                raise self._failure
            assert self._keys is not None
        return self._keys

    def _unreadable(self) -> ArtifactError:
        """What is wrong with a file whose entries do not decode, where in the file, as
        a whole read says it."""
        from pytest_arbiter.store import strictjson

        data = bytes(self._array.obj)
        try:
            _WHOLE.decode(data)
        except msgspec.DecodeError as exc:
            return ArtifactError(str(strictjson.syntax_error(exc, data, self.source)))
        except UnicodeDecodeError:
            return ArtifactError(str(strictjson.not_utf8(data, self.source)))
        except RecursionError:
            pass
        return self._error("not a valid cache file: its entries are nested too deeply")

    def _complete_all(self) -> None:
        entries = self._decode_all()
        fresh = dict(zip(map(plain_key, entries), entries, strict=True))
        if len(fresh) != len(entries):
            fresh = dict(self._resolve(entries))
        fresh.update(self._decoded)  # an entry handed out stays the one object
        self._decoded, self._complete = fresh, True

    def _decode(self, place: Callable[[], int], raw: Any) -> CacheEntry:
        tables = self.tables
        tables.pending = []  # what a failed decode left behind is not this entry's
        try:
            entry: CacheEntry = _read_tables(lambda: _ONE.decode(raw), tables)
            finish_read([entry], tables)
        except msgspec.ValidationError as exc:
            raise self._error(_entry_path(_message(exc), place())) from None
        except BadEntry as exc:
            raise self._error(BadEntry(place(), exc.detail, exc.at).path()) from None
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise self._error(_entry_path(f"not a valid entry: {exc}", place())) from None
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
