"""The write of a few changed keys into a big cache file: the unchanged entries' lines
copied as they lie, only the changed and new entries encoded.

A file read in the writer's layout (one entry a line, sorted by key) is remembered as
:class:`Layout`: its tables and its entries' keys in the file's order (the entries need
not have been decoded). While the file is still
that one (its stamp, checked on the open file), the merged file is the old one with the
changed entries' lines replaced and the new keys' lines inserted in key order; the table
rows the new entries need that the tables lack are appended after the existing ones (in
canonical JSON order), so every old line's indices stay valid. Anything else is for the
caller's full write.

The bytes equal the full write's (:func:`~pytest_arbiter.store.cache_file.encode_chunks`)
when the old file was the full write's and the changed entries need no new row and
leave no row without entries; else the tables differ (new rows last, a row left without
entries kept) and the file reads back to the same entries. Either way the bytes depend
only on the old file and the merged entries.
"""

from __future__ import annotations

import operator
import os
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, BinaryIO, NamedTuple

import msgspec
from msgspec import Struct

from pytest_arbiter.store.cache_file import _NEXT, _TAIL, Rows, head_bytes
from pytest_arbiter.store.entry import CacheEntry, KeyTuple
from pytest_arbiter.store.tables import (
    _CANONICAL,
    NO_CONSIDERED,
    NO_ENVIRONMENT,
    NO_RUN,
    FrozenMap,
    _inline,
    _Tables,
)

Stamp = tuple[int, int, int, int, int]
_SHARED = (attrgetter("provenance.run"), attrgetter("environment"), attrgetter("considered"))
_EMPTY: tuple[FrozenMap[Any, Any], ...] = (NO_RUN, NO_ENVIRONMENT, NO_CONSIDERED)


@dataclass(frozen=True)
class Layout:
    """A file read in the writer's layout: its tables as read, its entries' keys in the
    file's order, one entry a key, and its bytes if they were kept (a lazy read keeps
    them: a splice of the same file need not read it again)."""

    tables: _Tables
    keys: list[KeyTuple]
    data: bytes | None = None

    def rows(self) -> tuple[list[Any], list[Any], list[Any]]:
        t = self.tables
        return list(t.runs or ()), list(t.environments or ()), list(t.considered or ())


class _Key(Struct, frozen=True, gc=False):
    """The key fields of an entry's line, the rest skipped."""

    device: str
    target: str
    op: str
    bucket: str
    dtype: str


_KEY = msgspec.json.Decoder(_Key)


def stamp_of_file(file: Any) -> Stamp:
    st = os.fstat(file.fileno())
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class FileRange(NamedTuple):
    """Bytes ``offset`` to ``offset + length`` of the open binary file ``source``: a piece
    of a write that :func:`pytest_arbiter.store.artifacts.write_bytes_atomic` copies from
    file to file in the kernel where it can (the unchanged lines of a big cache)."""

    source: BinaryIO
    offset: int
    length: int


def spliced(path: str | os.PathLike[str], stamp: Stamp, layout: Layout,
            changes: Mapping[KeyTuple, CacheEntry]) -> list[Any] | None:
    """The pieces of the file at ``path`` with ``changes`` (the entries of changed and
    new keys) spliced in, to write one after the other (the unchanged lines as
    :class:`FileRange` pieces of the open file: :func:`close_sources` closes it once they
    are written); ``None`` if the file is not the one read (``stamp``) in the writer's
    layout: then write the whole file."""
    try:
        file = open(path, "rb")  # left open: the pieces copy from it
    except OSError:
        return None
    pieces = None
    try:
        if stamp_of_file(file) == stamp:
            data = file.read() if layout.data is None else layout.data
            pieces = _splice(file, data, layout, changes)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, TypeError):
        pieces = None  # a line that is not one entry of the key it should hold
    if pieces is None or not any(isinstance(p, FileRange) for p in pieces):
        file.close()  # nothing copies from it (every old line replaced)
    return pieces


def close_sources(pieces: list[Any]) -> None:
    """Close the files the :class:`FileRange` pieces of ``pieces`` read from."""
    for piece in pieces:
        if isinstance(piece, FileRange):
            piece.source.close()


def _splice(file: BinaryIO, data: bytes, layout: Layout,
            changes: Mapping[KeyTuple, CacheEntry]) -> list[Any] | None:
    old = layout.keys
    n = len(old)
    rows = layout.rows()
    head = head_bytes(*(Rows.of(r, {}) for r in rows))
    end = len(data) - len(_TAIL)
    if (not n or not data.startswith(head) or not data.endswith(_TAIL)
            or data.count(b"\n", len(head), end) != n - 1
            or data.count(_NEXT, len(head), end) != n - 1
            or not all(map(operator.lt, old, old[1:]))):
        return None
    ops: list[tuple[int, bool, CacheEntry]] = []  # (line, replaces it, entry), key order
    for key in sorted(changes):
        at = bisect_left(old, key)
        ops.append((at, at < n and old[at] == key, changes[key]))
    region = memoryview(data)[len(head):end]
    checked = {min(at, n - 1) for at, _, _ in ops}  # a line at each boundary
    starts = _line_starts(data, len(head), end, n, {*checked, *(i + 1 for i in checked),
                                                 *(at + swap for at, swap, _ in ops)})
    for line in checked:  # holds the entry it should: a boundary between entries
        stop = starts[line + 1] - len(_NEXT)
        if old[line] != tuple(msgspec.structs.astuple(
                _KEY.decode(region[starts[line]:stop]))):
            return None
    lines, tables = _encoded([entry for _, _, entry in ops], rows)
    items: list[Any] = []
    copied = 0  # the next old line to copy
    base = len(head)

    def lines_of(first: int, stop: int) -> FileRange:
        return FileRange(file, base + first, stop - first)

    for (at, swap, _), text in zip(ops, lines, strict=True):
        if at > copied:
            items.append(lines_of(starts[copied], starts[at] - len(_NEXT)))
        items.append(text)
        copied = at + swap
    if copied < n:
        items.append(lines_of(starts[copied], end - base))
    pieces: list[Any] = [head_bytes(*(Rows.of(r, {}) for r in tables))]
    for item in items:
        pieces += (item, _NEXT)
    pieces[-1] = _TAIL
    return pieces


def _line_starts(data: bytes, begin: int, end: int, count: int, wanted: set[int]
                 ) -> dict[int, int]:
    """Where each ``wanted`` line of the ``count`` in ``data[begin:end]`` (entries joined
    by ``,`` and a line break) starts, from ``begin``; a line past the last starts at the
    end (as if one more followed). Walked from whichever end is nearer."""
    starts = {line: end - begin + len(_NEXT) for line in wanted if line >= count}
    starts[0] = 0
    inside = {line for line in wanted if 0 < line < count}
    if not inside:
        return starts
    lowest, highest = min(inside), max(inside)
    if lowest > count - highest:  # back from the end
        line, at = count - 1, end
        while line >= lowest:
            at = data.rfind(b"\n", begin, at)
            if line in inside:
                starts[line] = at + len(_NEXT) - 1 - begin
            line -= 1
        return starts
    line, at = 0, begin
    while line < highest:
        at = data.find(b"\n", at, end) + len(_NEXT) - 1
        line += 1
        if line in inside:
            starts[line] = at - begin
    return starts


def _encoded(entries: list[CacheEntry], rows: tuple[list[Any], ...]
             ) -> tuple[list[bytes], tuple[list[Any], ...]]:
    """The lines of ``entries`` against ``rows`` (the file's tables), and the tables
    with the rows they need that the tables lack appended in canonical JSON order."""
    tables = tuple(list(r) for r in rows)
    by_id: dict[int, int] = {}
    for table, shared, empty in zip(tables, _SHARED, _EMPTY, strict=True):
        index = {row: i for i, row in enumerate(table)}
        objects = [o for o in map(shared, entries) if o != empty]
        missing = {o for o in objects if o not in index}
        for row in sorted(missing, key=_CANONICAL.encode):
            index[row] = len(table)
            table.append(row)
        by_id.update((id(o), index[o]) for o in objects)

    def hook(value: Any) -> Any:
        found = by_id.get(id(value))
        return _inline(value) if found is None else found

    encode = msgspec.json.Encoder(enc_hook=hook, order="deterministic").encode
    return [encode(e) for e in entries], tables
