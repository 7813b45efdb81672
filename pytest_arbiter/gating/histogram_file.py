"""The dispatch histogram's file format, which is also the baseline's.

The models below are the format's documentation and its validation: one msgspec
decode checks every type and bound and names the JSON path of a bad value
(``$.entries[3].count``); unknown fields, missing ones, NaN, infinities and
out-of-range numbers are refused (see :mod:`pytest_arbiter.store.strictjson` for what every
JSON artifact is checked for besides). A file this package writes also carries the
sum of its counts (``total``), checked on read, so a damaged count (a ``1`` become a
``0``) is an error rather than a degrade gone; a hand-written file may leave it out.

Kept apart from :mod:`pytest_arbiter.gating.histogram` (the counters of the dispatch hot
path) so that loading the plugin does not import msgspec.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping
from itertools import compress
from operator import attrgetter
from typing import Annotated, Any, Literal

import msgspec

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.gating.histogram import (
    HISTOGRAM_SCHEMA,
    HISTOGRAM_VERSION,
    CountColumns,
    HistogramKey,
    Outcome,
    join_keys,
)
from pytest_arbiter.store import strictjson
from pytest_arbiter.store.artifacts import read_bytes, write_text_atomic
from pytest_arbiter.store.safetext import escape

MAX_COUNT = 2**63 - 1
"""The largest count a file may hold (a signed 64-bit integer)."""

Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Name = Annotated[str, msgspec.Meta(min_length=1)]


class HistogramEntry(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True,
                     kw_only=True, omit_defaults=True):
    """How many dispatches of one (target, op, selected candidate) had one outcome.

    Fields in the order they are written (sorted, as the first writer wrote them).
    """

    count: Count
    expected: Count = 0
    """How many of ``count`` came from tests that degrade on purpose (written when not
    zero); the gates leave these out."""
    op: Name
    outcome: Outcome
    selected: Name
    """The candidate the arbiter selected (``none`` when nothing applied)."""
    target: Name

    @property
    def key(self) -> HistogramKey:
        return HistogramKey(self.target, self.op, self.selected, self.outcome)


class HistogramTotal(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True,
                     kw_only=True):
    """The sums of the entries' ``count`` and ``expected``: a check, written by this
    package, that no count was damaged."""

    count: Annotated[int, msgspec.Meta(ge=0)]
    expected: Annotated[int, msgspec.Meta(ge=0)]


class HistogramDocument(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True,
                        kw_only=True, omit_defaults=True):
    """A histogram (or baseline) file: ``schema``, ``version``, the entries sorted by
    (target, op, selected, outcome), and optionally their ``total``."""

    entries: tuple[HistogramEntry, ...]
    schema: Literal["pytest-arbiter/histogram"]
    total: HistogramTotal | None = None
    version: Literal[1]

    def __post_init__(self) -> None:
        # the entries' own checks, for all of them at once (C loops, not a call each)
        counts = list(map(_COUNT, self.entries))
        expected_each = list(map(_EXPECTED, self.entries))
        if any(expected_each) and any(map(operator.gt, expected_each, counts)):
            at = next(i for i, e in enumerate(self.entries) if e.expected > e.count)
            bad = self.entries[at]
            raise ValueError(f"expected ({bad.expected}) is more than count ({bad.count}) "
                             f"in entries[{at}]")
        if self.total is None:
            return
        count = sum(counts)
        expected = sum(expected_each)
        if (count, expected) != (self.total.count, self.total.expected):
            raise ValueError(
                f"the entries add up to count {count}, expected {expected}, but total says "
                f"count {self.total.count}, expected {self.total.expected} (damaged, or "
                "edited by hand: fix or delete the total)")


_COUNT = attrgetter("count")
_EXPECTED = attrgetter("expected")
_KEY_FIELDS = attrgetter("target", "op", "selected", "outcome")


def strings(doc: HistogramDocument) -> int:
    """How many JSON strings a file of ``doc`` holds if no object has a key twice: the
    top level's three keys and its schema, each entry's five keys (six with a
    non-zero ``expected``) and four names, the total's key and its two
    (:func:`pytest_arbiter.store.strictjson.decode` checks the file's quotes against it)."""
    n = len(doc.entries)
    nonzero = n - list(map(_EXPECTED, doc.entries)).count(0)
    return 4 + 9 * n + nonzero + (3 if doc.total is not None else 0)


BaselineDocument = HistogramDocument
"""A baseline is a histogram file: its degraded, rejected and error entries are the
known ones."""


class _Header(msgspec.Struct):
    schema: Any = None
    version: Any = None


# made at import: msgspec resolves a model's annotations through sys.modules on first
# use, which a module that was imported and then dropped from it (pytester's in-process
# runs) would no longer find
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(HistogramDocument)
_HEADER_DECODER = msgspec.json.Decoder(_Header)


def document(counts: Mapping[HistogramKey, int],
             expected: Mapping[HistogramKey, int] | None = None) -> HistogramDocument:
    """The document for ``counts``: entries sorted by key, each key's ``expected`` (how
    many were degrades on purpose) capped at its count, and the total."""
    entries = []
    for key, count in sorted(counts.items()):
        on_purpose = min(count, (expected or {}).get(key, 0))
        target, op, selected, outcome = key
        entries.append(HistogramEntry(count=count, expected=max(on_purpose, 0), op=op,
                                      outcome=outcome,
                                      selected=selected, target=target))
    total = HistogramTotal(count=sum(e.count for e in entries),
                           expected=sum(e.expected for e in entries))
    return HistogramDocument(entries=tuple(entries), schema=HISTOGRAM_SCHEMA, total=total,
                             version=HISTOGRAM_VERSION)


def encode(doc: HistogramDocument) -> bytes:
    """The file's bytes: sorted keys, two-space indentation, a trailing newline; the same
    document always gives the same bytes. ``ValueError`` if the document is not one a
    reader would accept (a negative count, an empty name, an unknown outcome)."""
    try:
        text = msgspec.json.format(_ENCODER.encode(doc), indent=2) + b"\n"
    except (UnicodeEncodeError, msgspec.EncodeError) as exc:
        raise ValueError(f"cannot encode the histogram: {escape(exc)}") from None
    try:
        _DECODER.decode(text)  # what is written must read back: the C decoder checks it
    except msgspec.ValidationError as exc:
        raise ValueError(f"cannot write the histogram: {escape(exc)}") from None
    return text


def decode(data: bytes, source: str) -> HistogramDocument:
    """The document in ``data``; ``ValueError`` naming ``source`` and what is wrong."""
    try:
        doc: HistogramDocument = strictjson.decode(data, source, HistogramDocument,
                                                   strings=strings)
    except ValueError as exc:
        raise ValueError(_header_problem(data, source) or str(exc)) from None
    return doc


def convert(data: Any, source: str) -> HistogramDocument:
    """A document from plain builtins (an xdist worker's payload), validated the same."""
    try:
        return msgspec.convert(data, HistogramDocument)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{escape(source)}: {escape(exc)}") from None


def _header_problem(data: bytes, source: str) -> str | None:
    """A clearer message for another schema or a newer version than the field path."""
    try:
        head = _HEADER_DECODER.decode(data)
    except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError):
        return None
    if head.schema != HISTOGRAM_SCHEMA:
        found = "missing" if head.schema is None else escape(repr(head.schema))
        return f"{escape(source)}: schema is {found}, expected {HISTOGRAM_SCHEMA!r}"
    if head.version != HISTOGRAM_VERSION:
        return (f"{escape(source)}: histogram version {escape(repr(head.version))} is not "
                f"supported (this pytest-arbiter reads version {HISTOGRAM_VERSION})")
    return None


def columns(doc: HistogramDocument, *, plain: bool = False
            ) -> tuple[CountColumns, CountColumns]:
    """The counts per key and, per key, how many were degrades on purpose (the keys
    with some), as columns (``plain``: see :func:`join_keys`). Two entries of one key (a
    hand-resolved merge conflict) add up, the key where it first appears."""
    entries = doc.entries
    keys, escaped = join_keys(entries, _KEY_FIELDS, plain=plain)
    counts = list(map(_COUNT, entries))
    expected_each = list(map(_EXPECTED, entries))
    out = CountColumns(keys, counts, escaped)
    if not out.ascending() and len(out.key_set()) != len(keys):
        total: dict[str, int] = {}
        expected: dict[str, int] = {}
        for key, count, on_purpose in zip(keys, counts, expected_each, strict=True):
            total[key] = total.get(key, 0) + count
            if on_purpose:
                expected[key] = expected.get(key, 0) + on_purpose
        return (CountColumns(list(total), list(total.values()), escaped),
                CountColumns(list(expected), list(expected.values()), escaped))
    return out, out.like(list(compress(keys, expected_each)),
                         list(compress(expected_each, expected_each)))


def decode_columns(data: bytes, source: str) -> tuple[CountColumns, CountColumns]:
    """:func:`columns` of the histogram file ``data``; ``ValueError`` naming ``source``."""
    return columns(decode(data, source), plain=b"\\" not in data)


def counts_and_expected(doc: HistogramDocument
                        ) -> tuple[dict[HistogramKey, int], dict[HistogramKey, int]]:
    """:func:`columns` as dicts."""
    counts, expected = columns(doc)
    return counts.to_dict(), expected.to_dict()


def read_histogram(path: str | os.PathLike[str]) -> dict[HistogramKey, int]:
    """The counts of a histogram (or baseline) file; ``ArtifactError`` naming the file
    and what is wrong (the JSON path of a bad value, an unknown or missing field)."""
    return read_histogram_expected(path)[0]


def read_columns(path: str | os.PathLike[str]) -> CountColumns:
    """:func:`read_histogram` as columns (a baseline of a million keys for the gate)."""
    data = read_bytes(path)
    try:
        return decode_columns(data, str(path))[0]
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None


def read_histogram_expected(path: str | os.PathLike[str]
                            ) -> tuple[dict[HistogramKey, int], dict[HistogramKey, int]]:
    """The counts of a histogram file and how many of them were degrades on purpose."""
    data = read_bytes(path)
    try:
        return counts_and_expected(decode(data, str(path)))
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None


def write_histogram(path: str | os.PathLike[str], counts: dict[HistogramKey, int],
                    expected: dict[HistogramKey, int] | None = None) -> None:
    """Write a histogram (or baseline) file atomically; ``ArtifactError`` naming it."""
    try:
        data = encode(document(counts, expected))
    except ValueError as exc:
        raise ArtifactError(f"cannot write {escape(path)}: {exc}") from None
    write_text_atomic(path, data.decode("utf-8"))


def payload(counts: Mapping[HistogramKey, int],
            expected: Mapping[HistogramKey, int] | None = None) -> dict[str, Any]:
    """The histogram file's document for ``counts`` as plain builtins (an xdist worker's
    payload)."""
    data: dict[str, Any] = msgspec.to_builtins(document(counts, expected))
    return data


def counts_of(data: Any, *, source: str = "histogram"
              ) -> tuple[dict[HistogramKey, int], dict[HistogramKey, int]]:
    """The counts, and the degrades on purpose, of a :func:`payload` (validated as the
    file is); ``ValueError`` naming ``source`` and the bad part."""
    return counts_and_expected(convert(data, source))
