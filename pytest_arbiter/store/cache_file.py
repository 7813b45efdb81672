"""The cache file: version 3 of schema ``pytest-arbiter/cache`` read and written.

``{"schema": ..., "version": 3, "runs": [...], "environments": [...], "considered":
[...], "entries": [...]}``: an entry's ``provenance.run``, ``environment`` and
``considered`` are indices into the tables (or, in a hand-written file, the object
itself). msgspec decodes and checks every field in one C pass; each entry's
``__post_init__`` swaps its indices for the shared rows and checks what no field's type
can say (an impossible row, a ``since`` in the future), and leaves anything unusual to
:func:`pytest_arbiter.store.entry.finish_read` after the decode, which names a bad entry.
A file in the writer's layout, one entry a line, is read a block of lines at a time; the
writer writes a chunk of lines at a time.
docs/artifacts.md describes the format.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from operator import attrgetter
from typing import Any, NoReturn

import msgspec
from msgspec import Struct

from pytest_arbiter.store.cache import CACHE_SCHEMA, CACHE_VERSION
from pytest_arbiter.store.cache_lazy import EntryLines, LazyEntries, Resolve
from pytest_arbiter.store.entry import BadEntry, CacheEntry, KeyTuple, finish_read, plain_key
from pytest_arbiter.store.tables import (
    _CANONICAL,
    NO_CONSIDERED,
    NO_ENVIRONMENT,
    NO_RUN,
    Considered,
    ConsideredMap,
    Environment,
    FrozenMap,
    Run,
    _convert,
    _inline,
    _interned,
    _message,
    _read_tables,
    _run_of,
    _RunRow,
    _Tables,
)


class _RunsTable(list[Run]):
    pass


class _EnvironmentsTable(list[Environment]):
    pass


class _ConsideredTable(list[ConsideredMap]):
    pass


def _table_hook(tables: _Tables) -> Any:
    """Reads a table of the file into ``tables`` as it is decoded (before the entries)."""

    def hook(kind: type, raw: Any) -> Any:
        if kind is _RunsTable:
            tables.runs = [_run_of(r) for r in _convert(raw, list[_RunRow])]
            return _RunsTable(tables.runs)
        if kind is _EnvironmentsTable:
            tables.environments = [_interned(Environment, r) for r in
                                   _convert(raw, list[dict[str, str]])]
            return _EnvironmentsTable(tables.environments)
        if kind is _ConsideredTable:
            tables.considered = [_interned(ConsideredMap, r) for r in
                                 _convert(raw, list[dict[str, Considered]])]
            return _ConsideredTable(tables.considered)
        raise NotImplementedError(kind)

    return hook


class _Document(Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    """The whole file, tables first."""

    schema: str
    version: int
    runs: _RunsTable = _RunsTable()
    environments: _EnvironmentsTable = _EnvironmentsTable()
    considered: _ConsideredTable = _ConsideredTable()
    entries: list[CacheEntry] = []


class _Header(Struct, frozen=True, gc=False):
    """What any version's file starts with; everything else skipped."""

    schema: Any = None
    version: Any = None


def _check_header(header: _Header, source: str) -> int:
    if header.schema is None:
        _refuse(f"{_escape(source)}: not a pytest-arbiter cache: it has no \"schema\" "
                f"field (a cache is a JSON object whose \"schema\" is {CACHE_SCHEMA!r})")
    if header.schema != CACHE_SCHEMA:
        _refuse(f"{_escape(source)}: schema is {_escape(repr(header.schema))}, expected "
                f"{CACHE_SCHEMA!r}")
    version = header.version
    if type(version) is not int or version < 1:
        _refuse(f"{_escape(source)}: cache version {_escape(repr(version))} is not a "
                "positive integer")
    if version > CACHE_VERSION:
        _refuse(f"{_escape(source)}: cache schema version {version} is newer than version "
                f"{CACHE_VERSION}, the newest this pytest-arbiter reads; upgrade it")
    if version < CACHE_VERSION:
        _refuse(f"{_escape(source)}: cache version {version} is not read by this "
                f"pytest-arbiter, which reads version {CACHE_VERSION}")
    return version


def _refuse(message: str) -> NoReturn:
    raise ValueError(message)


def _validation(exc: msgspec.ValidationError, source: str) -> ValueError:
    return ValueError(f"{_escape(source)}: {_escape(_message(exc))}")


def decode_document(data: bytes, *, source: str = "cache") -> list[CacheEntry]:
    """The entries of a cache file (any version); ``ValueError`` naming ``source`` and
    what is wrong (the position of a syntax error, the JSON path of a bad value)."""
    from pytest_arbiter.store import strictjson

    strictjson.check_bom(data, source)
    tables = _Tables()
    decoder = msgspec.json.Decoder(_Document, dec_hook=_table_hook(tables))
    failed: msgspec.ValidationError | None = None
    try:
        doc: _Document = _read_tables(lambda: decoder.decode(data), tables)
    except msgspec.ValidationError as exc:
        failed = exc
    except msgspec.DecodeError as exc:
        raise _syntax(exc, data, source) from None
    except UnicodeDecodeError:  # msgspec < 0.19 says so in the string's own terms
        raise _not_utf8(data, source) from None
    except RecursionError:
        raise ValueError(f"{_escape(source)} is nested too deeply") from None
    else:
        if doc.version == CACHE_VERSION and doc.schema == CACHE_SCHEMA:
            return _finished(doc.entries, tables, source)
    # not a valid version 3 file: another version, or a bad one
    try:
        header = msgspec.json.decode(data, type=_Header)
    except msgspec.ValidationError:  # not an object
        header = _Header()
    except msgspec.DecodeError as exc:
        raise _syntax(exc, data, source) from None
    except UnicodeDecodeError:
        raise _not_utf8(data, source) from None
    except RecursionError:
        raise ValueError(f"{_escape(source)} is nested too deeply") from None
    _check_header(header, source)
    assert failed is not None  # a version 3 header: the decode failed on something else
    raise _validation(failed, source)


def _finished(entries: list[CacheEntry], tables: _Tables, source: str) -> list[CacheEntry]:
    """``entries`` through :func:`finish_read`; ``ValueError`` naming ``source`` and the
    first impossible entry."""
    try:
        finish_read(entries, tables)
    except BadEntry as exc:
        raise ValueError(f"{_escape(source)}: {_escape(exc.path())}") from None
    return entries


_HEAD = b'{\n  "schema": "pytest-arbiter/cache",\n  "version": 3,\n  "runs": ['
_ENTRIES = b'\n  "entries": [\n    {"device":'
_SEPARATOR = b',\n    {"device":'
_TAIL = b"\n  ]\n}\n"
"""What a file with entries ends with, after its last entry."""
BLOCK = 1 << 20
"""Bytes read at a time from a cache file in the writer's layout: a block's entries
(about 1,500) stay in the processor's cache while a command walks them, column by
column (16 MB blocks took ``show`` a fifth longer)."""


def read_document(path: str | os.PathLike[str], *, source: str | None = None
                  ) -> list[CacheEntry]:
    """The entries of the cache file at ``path``; ``ValueError`` as
    :func:`decode_document` says, ``OSError`` if it cannot be read.

    A file in the writer's layout (one entry a line) is decoded a block of lines at a
    time, so the file's bytes are never all in memory beside its entries (a third of a
    million-entry load's peak); anything else, or any error, is decoded whole (which
    names the error's exact place).
    """
    return read_with_tables(path, source=source)[0]


def read_with_tables(path: str | os.PathLike[str], *, source: str | None = None
                     ) -> tuple[list[CacheEntry], _Tables | None]:
    """:func:`read_document`, in the file's order, and the file's tables as read if it is
    in the writer's layout (``None`` if it was decoded whole)."""
    name = str(path) if source is None else source
    tables = _Tables()
    with open(path, "rb") as file:
        entries = _stream(file, tables)
        if entries is not None:
            return entries, tables
        file.seek(0)
        data = file.read()
    return decode_document(data, source=name), None


class Unstreamable(Exception):
    """A file read block by block is not in the writer's layout, or something in it is
    wrong: read it whole instead, which names what and where."""


def _stream(file: Any, tables: _Tables | None = None) -> list[CacheEntry] | None:
    """The entries of a file in the writer's layout, block by block (its tables into
    ``tables``); ``None`` if it is not in that layout or anything in it is wrong."""
    entries: list[CacheEntry] = []
    try:
        for block in entry_blocks(file, tables):
            entries += block
    except Unstreamable:
        return None
    return entries


def entry_blocks(file: Any, tables: _Tables | None = None,
                 decode: Callable[[memoryview], list[Any]] | None = None,
                 rows: Callable[[_Tables], None] | None = None) -> Iterator[list[Any]]:
    """The entries of a binary ``file`` in the writer's layout, a block of lines at a
    time, in the file's order; :class:`Unstreamable` (maybe after some blocks) if it is
    not in that layout or anything in it is wrong. ``tables``, if given, receives the
    file's tables before the first block. ``decode``, if given, decodes each block (a
    JSON array of the block's entries) instead, into what it likes. ``rows``, if given,
    is called with the tables as read, before any entry is decoded: it may put in their
    place what the entries' indices should become (another file's row numbers)."""
    buffer = bytearray(BLOCK)
    size = file.readinto(buffer)
    head = buffer.find(_ENTRIES, 0, size)
    if not buffer.startswith(_HEAD) or head < 0:
        raise Unstreamable
    tables = _Tables() if tables is None else tables
    _head_tables(bytes(buffer[:head]), tables)
    if rows is not None:
        rows(tables)
    decoder = msgspec.json.Decoder(list[CacheEntry])
    start = head + len(b'\n  "entries": [\n   ')  # the space before the first entry
    done = False
    while True:
        end = buffer.rfind(_SEPARATOR, start, size)
        if done:
            if not buffer.endswith(_TAIL, start, size):
                raise Unstreamable
            end = size - len(_TAIL)
        if end >= 0:
            # the space before the block's first entry and the comma after its last
            # become the brackets of an array: decoded where they lie, no copy
            buffer[start], buffer[end] = 0x5B, 0x5D
            with memoryview(buffer) as view, view[start:end + 1] as block:
                try:
                    if decode is None:
                        entries = _read_tables(functools.partial(decoder.decode, block),
                                               tables)
                        finish_read(entries, tables)
                    else:
                        entries = decode(block)
                except (msgspec.DecodeError, BadEntry, RecursionError, UnicodeDecodeError):
                    raise Unstreamable from None
            yield entries
            if done:
                return
            start = end + len(_SEPARATOR) - len(b' {"device":')
        rest = size - start
        buffer[:rest] = buffer[start:size]
        if len(buffer) < rest + BLOCK:
            buffer.extend(bytes(rest + BLOCK - len(buffer)))
        with memoryview(buffer) as view:
            read = file.readinto(view[rest:rest + BLOCK])
        size, start, done = rest + read, 0, read == 0


def _head_tables(head: bytes, tables: _Tables) -> None:
    """The tables of a file's ``head`` (up to its entries) into ``tables``;
    :class:`Unstreamable` if it cannot be read."""
    try:
        msgspec.json.decode(head + b'\n  "entries": []}', type=_Document,
                            dec_hook=_table_hook(tables))
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        raise Unstreamable from None


def file_tables(file: Any, tables: _Tables) -> None:
    """The tables of a binary ``file`` in the writer's layout into ``tables`` (its
    first block read, no entry decoded); :class:`Unstreamable` if it is not in that
    layout or they cannot be read."""
    buffer = file.read(BLOCK)
    head = buffer.find(_ENTRIES)
    if not buffer.startswith(_HEAD) or head < 0:
        raise Unstreamable
    _head_tables(buffer[:head], tables)


class _Key(Struct, frozen=True, gc=False, order=True):
    """An entry's key, the rest of it skipped; keys order as :data:`KeyTuple` do."""

    device: str
    target: str
    op: str
    bucket: str
    dtype: str


_KEYS = msgspec.json.Decoder(list[_Key])


def lazy_entries(data: bytes, source: str, resolve: Resolve) -> LazyEntries | None:
    """The entries of the file ``data`` in the writer's layout, read lazily
    (:mod:`pytest_arbiter.store.cache_lazy`): its tables decoded now, no entry's key
    (the lines a lookup's search lands on are decoded then; ``resolve``, the merge rule,
    picks among the entries of a key found twice); ``None`` if it is not in the
    writer's layout: read it whole, which names what is wrong."""
    head = data.find(_ENTRIES)
    if not data.startswith(_HEAD) or head < 0 or not data.endswith(_TAIL):
        return None
    tables = _Tables()
    # from the entries' opening bracket to their closing one
    array = memoryview(data)[head + len(b'\n  "entries": '):len(data) - len(b"\n}\n")]
    try:
        msgspec.json.decode(data[:head] + b'\n  "entries": []}', type=_Document,
                            dec_hook=_table_hook(tables))
        # every entry's key, the entries' JSON parsed whole: a cut line, a conflict
        # marker, a key that is not five strings go to the whole read, which names them
        keys = _KEYS.decode(array)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError,
            UnicodeDecodeError):
        return None
    lines = EntryLines(data, head + len(_ENTRIES) - len(b'{"device":'),
                       len(data) - len(_TAIL))
    # one entry a line, each key after the one before: else (a hand-resolved conflict,
    # a key listed twice) the whole read, and the merge rule for a key listed twice
    if not keys or len(lines) != len(keys) or not all(map(operator.lt, keys, keys[1:])):
        return None
    return LazyEntries(source, tables, array, lines, resolve)


def in_key_order(file: Any) -> bool:
    """Whether a binary ``file`` is in the writer's layout, one entry a key, in key
    order: its keys alone decoded, a block at a time (about a fifth of a read's time).
    An entry may still be wrong: only reading it says."""
    last: _Key | None = None
    keys: list[_Key]
    try:
        for keys in entry_blocks(file, decode=_KEYS.decode):
            if not keys:
                continue
            if (last is not None and not last < keys[0]) or not all(
                    map(operator.lt, keys, keys[1:])):
                return False
            last = keys[-1]
    except Unstreamable:
        return False
    return True


def key_blocks(file: Any, tables: _Tables | None = None) -> Iterator[list[CacheEntry]]:
    """:func:`entry_blocks`, each entry's key after the one before (the writer's order,
    one entry a key); :class:`Unstreamable` where one is not."""
    for block, _ in keyed_blocks(file, tables):
        yield block


def keyed_blocks(file: Any, tables: _Tables | None = None,
                 rows: Callable[[_Tables], None] | None = None
                 ) -> Iterator[tuple[list[CacheEntry], list[KeyTuple]]]:
    """:func:`key_blocks`, each block with its entries' keys (``rows`` as
    :func:`entry_blocks` says)."""
    last: tuple[str, ...] = ()
    for block in entry_blocks(file, tables, rows=rows):
        keys = list(map(plain_key, block))
        if not keys:
            continue
        if not (last < keys[0] and all(map(operator.lt, keys, keys[1:]))):
            raise Unstreamable
        last = keys[-1]
        yield block, keys


def convert_document(data: Any, *, source: str = "cache") -> list[CacheEntry]:
    """:func:`decode_document` for a document already parsed into builtins."""
    if not isinstance(data, Mapping):
        _refuse(f"{_escape(source)}: expected a JSON object, got {type(data).__name__}")
    _check_header(_Header(data.get("schema"), data.get("version")), source)
    tables = _Tables()
    hook = _table_hook(tables)
    try:
        doc: _Document = _read_tables(
            lambda: msgspec.convert(data, _Document, dec_hook=hook), tables)
    except msgspec.ValidationError as exc:
        raise _validation(exc, source) from None
    return _finished(doc.entries, tables, source)


def _syntax(exc: msgspec.DecodeError, data: bytes, source: str) -> ValueError:
    from pytest_arbiter.store import strictjson

    return strictjson.syntax_error(exc, data, source)


def _not_utf8(data: bytes, source: str) -> ValueError:
    from pytest_arbiter.store import strictjson

    return strictjson.not_utf8(data, source)


def _escape(text: object) -> str:
    from pytest_arbiter.store.safetext import escape

    return escape(text)


# -- writing ----------------------------------------------------------------------------


class Rows:
    """The distinct shared objects of the entries to write, as table rows in the order
    of their canonical JSON, and each object's row (by identity: equal ones are
    interned, so they are one object)."""

    def __init__(self, objects: list[FrozenMap[Any, Any]], empty: FrozenMap[Any, Any]
                 ) -> None:
        by_id = dict(zip(map(id, objects), objects, strict=True))  # C loops: ~5 ms for 100k
        distinct = set(by_id.values())
        distinct.discard(empty)
        self.rows = [o for _, o in sorted((_CANONICAL.encode(o), o) for o in distinct)]
        row = {o: i for i, o in enumerate(self.rows)}
        self.by_id = {i: row[o] for i, o in by_id.items() if o in row}

    @classmethod
    def of(cls, rows: list[FrozenMap[Any, Any]], by_id: dict[int, int]) -> Rows:
        """Rows in the order given, and ``by_id``: the row of each object by identity."""
        made = cls.__new__(cls)
        made.rows, made.by_id = rows, by_id
        return made


_NEXT = b",\n    "
_LINE = msgspec.json.Encoder(enc_hook=_inline, order="deterministic")


def _sorted(entries: Iterable[CacheEntry]) -> list[CacheEntry]:
    """The entries sorted by key. Entries order by their key first (``order=True``), so
    the check that a cache read from a file already is, and the sort, are C loops."""
    listed = list(entries)
    try:
        if all(map(operator.le, listed, listed[1:])):
            return listed
        return sorted(listed)
    except TypeError:  # one key twice, and the entries alike up to unordered fields
        return sorted(listed, key=plain_key)


def _plan(entries: Iterable[CacheEntry]) -> tuple[list[CacheEntry], Rows, Rows, Rows]:
    ordered = _sorted(entries)
    runs = Rows(list(map(attrgetter("provenance.run"), ordered)), NO_RUN)
    environments = Rows(list(map(attrgetter("environment"), ordered)), NO_ENVIRONMENT)
    considered = Rows(list(map(attrgetter("considered"), ordered)), NO_CONSIDERED)
    return ordered, runs, environments, considered


def _encode_hook(*tables: Rows) -> Any:
    rows = {i: row for table in tables for i, row in table.by_id.items()}

    def hook(value: Any) -> Any:
        # a shared object: its row; else (the reasons of a rejected) the object inline
        found = rows.get(id(value))
        return _inline(value) if found is None else found

    return hook


def document_builtins(entries: Iterable[CacheEntry]) -> dict[str, Any]:
    """The document of ``entries`` as plain builtins."""
    ordered, runs, environments, considered = _plan(entries)
    hook = _encode_hook(runs, environments, considered)
    return {"schema": CACHE_SCHEMA, "version": CACHE_VERSION,
            "runs": msgspec.to_builtins(runs.rows, enc_hook=_inline),
            "environments": msgspec.to_builtins(environments.rows, enc_hook=_inline),
            "considered": msgspec.to_builtins(considered.rows, enc_hook=_inline),
            "entries": msgspec.to_builtins(ordered, enc_hook=hook)}


LINES_PER_CHUNK = 8192
"""Entries encoded at a time by :func:`encode_chunks` (about 5 MB)."""


def encode_chunks(entries: Iterable[CacheEntry]) -> Iterator[bytes]:
    """The file of ``entries`` in pieces, to write one after the other: tables first,
    entries sorted by key, one per line, dict keys sorted.

    Every entry holds what a read gives back (one read from a file was validated by the
    read, one built in code when it was built), so reading the file and writing it
    again gives the same bytes. The tables are worked out before the first piece; the
    entries are encoded a chunk at a time, so a million of them never sit in memory a
    second time as text.
    """
    ordered, runs, environments, considered = _plan(entries)
    if not ordered:
        yield head_bytes(runs, environments, considered, entries=False) + b"]\n}\n"
        return
    yield head_bytes(runs, environments, considered)
    yield from entry_lines((ordered[at:at + LINES_PER_CHUNK]
                            for at in range(0, len(ordered), LINES_PER_CHUNK)),
                           runs, environments, considered)


def head_bytes(runs: Rows, environments: Rows, considered: Rows, *,
               entries: bool = True) -> bytes:
    """The file up to its first entry: the header and the tables."""
    head = [b'{\n  "schema": "', CACHE_SCHEMA.encode(), b'",\n  "version": ',
            str(CACHE_VERSION).encode(), b",\n"]
    for name, rows in (("runs", runs.rows), ("environments", environments.rows),
                       ("considered", considered.rows)):
        head.append(f'  "{name}": ['.encode())
        if rows:
            head.append(b"\n    " + b",\n    ".join(map(_LINE.encode, rows)) + b"\n  ")
        head.append(b"],\n")
    head.append(b'  "entries": [')
    if entries:
        head.append(b"\n    ")
    return b"".join(head)


def entry_lines(chunks: Iterable[list[CacheEntry]], *tables: Rows) -> Iterator[bytes]:
    """The file after :func:`head_bytes`: the entries of ``chunks`` (sorted by key, at
    least one in all), each pointing into ``tables``, and the end of the document."""
    encode_lines = msgspec.json.Encoder(enc_hook=_encode_hook(*tables),
                                        order="deterministic").encode_lines
    held = b""
    for chunk in chunks:
        if chunk:
            # one line per entry, each ended by a line break (a JSON string never holds
            # a raw one) that becomes the separator; the last entry's is left out
            if held:
                yield held
            held = encode_lines(chunk).replace(b"\n", _NEXT)
    yield held[:-len(_NEXT)]
    yield b"\n  ]\n}\n"


def encode_document(entries: Iterable[CacheEntry]) -> bytes:
    """The file of ``entries`` (:func:`encode_chunks`) as one ``bytes``."""
    return b"".join(encode_chunks(entries))
