"""The write of a few changed keys into a big cache file: the unchanged entries' lines
copied as they lie, only the changed and new entries encoded.

A file read lazily in the writer's layout (one entry a line, sorted by key) is
remembered as :class:`Layout`: its tables, its bytes and their
:class:`~pytest_arbiter.store.cache_lazy.EntryLines` (no entry need have been decoded).
While the file is still that one (its stamp, checked on the open file), the merged file
is the old one with the changed entries' lines replaced and the new keys' lines inserted
in key order, each found by a binary search over the lines
(:meth:`~pytest_arbiter.store.cache_lazy.EntryLines.locate`: a few dozen lines' keys
read, the lines either side of each change among them); the lines between two changes
are copied as one range, unread. The table rows the new entries need that the tables
lack are appended after the existing ones (in canonical JSON order), so every old line's
indices stay valid. Anything else (a line read that is not one whole entry in key
order, a key listed twice) is for the caller's full write.

The bytes equal the full write's (:func:`~pytest_arbiter.store.cache_file.encode_chunks`)
when the old file was the full write's and the changed entries need no new row and
leave no row without entries; else the tables differ (new rows last, a row left without
entries kept) and the file reads back to the same entries. Either way the bytes depend
only on the old file and the merged entries.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, BinaryIO, NamedTuple

import msgspec

from pytest_arbiter.store.cache_file import _NEXT, _TAIL, Rows, head_bytes
from pytest_arbiter.store.cache_lazy import Broken, EntryLines
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
    """A file read lazily in the writer's layout: its tables as read, its bytes, and
    the entry lines found in them."""

    tables: _Tables
    lines: EntryLines
    data: bytes

    def rows(self) -> tuple[list[Any], list[Any], list[Any]]:
        t = self.tables
        return list(t.runs or ()), list(t.environments or ()), list(t.considered or ())


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
            pieces = _splice(file, layout, changes)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, TypeError):
        pieces = None
    if pieces is None or not any(isinstance(p, FileRange) for p in pieces):
        file.close()  # nothing copies from it (every old line replaced)
    return pieces


def close_sources(pieces: list[Any]) -> None:
    """Close the files the :class:`FileRange` pieces of ``pieces`` read from."""
    for piece in pieces:
        if isinstance(piece, FileRange):
            piece.source.close()


def _splice(file: BinaryIO, layout: Layout, changes: Mapping[KeyTuple, CacheEntry]
            ) -> list[Any] | None:
    lines, data, rows = layout.lines, layout.data, layout.rows()
    head = head_bytes(*(Rows.of(r, {}) for r in rows))
    if (lines.data is not data or lines.begin != len(head)
            or lines.end != len(data) - len(_TAIL) or not data.startswith(head)):
        return None
    ops: list[tuple[int, bool, CacheEntry]] = []  # (line start, replaces it, entry)
    try:
        for key in sorted(changes):
            at, swap = lines.place(key)  # the lines either side of it read
            ops.append((at, swap, changes[key]))
    except Broken:
        return None
    texts, tables = _encoded([entry for _, _, entry in ops], rows)
    items: list[Any] = []
    copied = lines.begin  # the next old line to copy

    def lines_from(first: int, before: int) -> FileRange:
        """The old lines from the one at ``first`` to the one before ``before``."""
        stop = lines.end if before == lines.past else before - len(_NEXT)
        return FileRange(file, first, stop - first)

    for (at, swap, _), text in zip(ops, texts, strict=True):
        if at > copied:
            items.append(lines_from(copied, at))
        items.append(text)
        copied = lines.next(at) if swap else at
    if copied != lines.past:
        items.append(lines_from(copied, lines.past))
    pieces: list[Any] = [head_bytes(*(Rows.of(r, {}) for r in tables))]
    for item in items:
        pieces += (item, _NEXT)
    pieces[-1] = _TAIL
    return pieces


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
