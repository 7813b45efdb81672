"""JSON as an artifact may hold it, or a clear error naming the file.

An artifact is UTF-8 without a byte order mark, holds no object with a key twice
(``{"entries": [...], "entries": []}`` would otherwise mean its last half), only
finite numbers, no lone UTF-16 surrogate escapes, and is nested at most
:data:`MAX_DEPTH` levels deep on every Python: 3.13's parsers take thousands of levels
without a ``RecursionError``, so :func:`check_depth` counts them itself (2 ms for a
10,000-entry histogram, 0.11 s for 40 MB: a fifth of the duplicate-key parse's time).
msgspec refuses most of this as it decodes (invalid UTF-8, lone surrogates, numbers out
of a double's range, ``NaN`` literals) and a typed decode never recurses into data it
does not expect; it keeps the last of two equal keys, though, so
:func:`check_unique_keys` parses once more with the standard library's parser and a
pairs hook (about 10 ms for a 10,000-entry histogram, 1.3 MB, on the 2-core test
machine, next to 3 ms for the typed decode; the whole read takes 17 ms, the
hand-written reader it replaced 20 ms).

Every error is a ``ValueError`` whose message names the source and, where there is one,
the position (line, column and byte) or the JSON path (``$.entries[3].count``), with
any text taken from the file escaped (:mod:`pytest_arbiter.store.safetext`).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from pytest_arbiter.store.safetext import escape

T = TypeVar("T")

_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF8, "UTF-8"), (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)
_BYTE_AT = re.compile(r" ?\(byte (\d+)\)")
_LONE_HIGH = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})")

MAX_DEPTH = 128
"""The deepest nesting of arrays and objects an artifact may have (serde_json's default;
the artifacts themselves go a handful of levels deep)."""
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_SQUARE = bytes.maketrans(b"{}", b"[]")


def check_bom(data: bytes, source: str) -> None:
    """``ValueError`` if ``data`` starts with a byte order mark."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise ValueError(f"{escape(source)} starts with a {name} byte order mark: an "
                             "artifact is UTF-8 without one")


def position(data: bytes, offset: int) -> str:
    """``line L, column C (byte N)`` of a byte offset, for an error message."""
    offset = max(0, min(offset, len(data)))
    line = data.count(b"\n", 0, offset) + 1
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return f"line {line}, column {column} (byte {offset})"


def syntax_error(exc: msgspec.DecodeError, data: bytes, source: str) -> ValueError:
    """msgspec's syntax error as ``SOURCE is not valid JSON: WHAT at line L, column C
    (byte N)``. msgspec says "truncated" both for data that ends early and for a lone
    high surrogate escape; the message tells them apart."""
    message = str(exc)
    found = _BYTE_AT.search(message)
    if found is not None:
        message = (message[:found.start()] + message[found.end():]
                   + " at " + position(data, int(found.group(1))))
    elif "truncated" in message:
        lone = _LONE_HIGH.search(data)
        if lone is not None:
            message = ("a string holds a lone UTF-16 surrogate escape at "
                       + position(data, lone.start()))
        else:
            message += " at " + position(data, len(data))
    return ValueError(f"{escape(source)} is not valid JSON: {escape(message)}")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return found


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def check_unique_keys(data: bytes, source: str) -> None:
    """``ValueError`` if an object of ``data`` (already known to be valid JSON) has a key
    twice: parsers keep one of them silently, so one file would mean two things."""
    try:
        json.loads(data, object_pairs_hook=_unique)
    except _DuplicateKey as dup:
        raise ValueError(f"{escape(source)}: the key {escape(json.dumps(dup.key))} "
                         "appears twice in one object") from None
    except RecursionError:
        raise too_deep(source) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ValueError(f"{escape(source)} is not valid JSON: {escape(exc)}") from None


def check_depth(data: bytes, source: str, limit: int = MAX_DEPTH) -> None:
    """``ValueError`` if ``data`` (already known to be valid JSON) nests arrays and
    objects more than ``limit`` deep, brackets inside strings aside.

    Counted on the bytes, whatever the interpreter's recursion limit: the escapes go, then
    everything but quotes and brackets; two adjacent quotes go too (an empty string, or
    one string's end and the next one's start: either way every other byte stays inside
    or outside a string as it was), so what remains of the strings is the few holding
    brackets. Each pass then removes the innermost pairs, one level a pass.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return
    if b"\\" in data:
        data = _ESCAPE.sub(b"", data)
    brackets = data.translate(_SQUARE, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in brackets:
        brackets = _STRING.sub(b"", brackets)
    for _ in range(limit):
        brackets = brackets.replace(b"[]", b"")
        if not brackets:
            return
    raise too_deep(source, limit)


def too_deep(source: str, limit: int = MAX_DEPTH) -> ValueError:
    """``SOURCE is nested too deeply (more than N levels)``."""
    return ValueError(f"{escape(source)} is nested too deeply (more than {limit} levels)")


def decode(data: bytes, source: str, schema: type[T] | Any = Any, *,
           strings: Callable[[T], int] | None = None) -> T:
    """``data`` decoded (as ``schema``, validated) and checked as the module says.

    ``strings``, for a schema of structs that refuse unknown fields and require the ones
    they have, says how many JSON strings (keys and values) a file of the decoded value
    holds when no object has a key twice. A key given twice is one string more, so when
    the bytes hold no escape (no string holds a quote) and twice that many quotes, no
    key is given twice, and the second parse is spared (one C count of the quotes). Such
    a schema also bounds the depth of what decodes as it (a few levels: a deeper value
    where a name or a count belongs is a validation error, and no unknown field's value
    is skipped unread), so the depth is not counted either."""
    check_bom(data, source)
    try:
        value: T = msgspec.json.decode(data, type=schema)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{escape(source)}: {escape(exc)}") from None
    except msgspec.DecodeError as exc:
        raise syntax_error(exc, data, source) from None
    except UnicodeDecodeError:  # msgspec < 0.19 lets the codec's error through
        raise not_utf8(data, source) from None
    except RecursionError:  # deeper than this interpreter's parsers go
        raise too_deep(source) from None
    if strings is None:
        check_depth(data, source)
        check_unique_keys(data, source)
    elif b"\\" in data or data.count(b'"') != 2 * strings(value):
        check_unique_keys(data, source)
    return value


def not_utf8(data: bytes, source: str) -> ValueError:
    """``SOURCE is not valid JSON: Invalid UTF-8 encoded string at line L, column C (byte
    N)``: what every msgspec version says of bytes that are not UTF-8, and where."""
    try:
        data.decode("utf-8")
        where = ""
    except UnicodeDecodeError as exc:
        where = " at " + position(data, exc.start)
    return ValueError(f"{escape(source)} is not valid JSON: Invalid UTF-8 encoded "
                      f"string{where}")
