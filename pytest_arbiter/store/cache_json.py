"""The self-contained JSON form of cache entries (``pytest-arbiter show --json``).

One object per entry, :meth:`pytest_arbiter.store.cache.CacheEntry.to_dict`'s, in a JSON
array: two-space indentation, keys sorted, ASCII only. The text is the one
``json.dump(..., indent=2, sort_keys=True)`` gives (the format the command has always
had, byte for byte), made by msgspec a chunk of entries at a time: about six times
faster than ``json.dump`` of the dicts, and the text of a million entries (2 GB) is
never all in memory at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter
from typing import Any

import msgspec
from msgspec import UNSET, Struct

from pytest_arbiter.store.entry import NO_SINCE, CacheEntry, RankedCandidate, _dimensions
from pytest_arbiter.store.tables import NO_RUN, Run

ENTRIES_PER_CHUNK = 4096
"""Entries encoded at a time."""

# The form of to_dict as structs, fields in sorted order: encoded in one C pass, without
# sorting the keys of each entry's dicts. A shared map (the environment, the candidates
# considered, the rejected, the versions) is encoded once, and its JSON reused.


class _Row(Struct, gc=False):
    carried: bool
    max_ns: Any
    median_ns: Any
    min_ns: Any
    name: str
    q1_ns: Any
    q3_ns: Any
    ratio: Any  # UNSET: none
    samples: int


class _Provenance(Struct, gc=False, omit_defaults=True):
    device_name: Any = UNSET
    host: Any = UNSET
    measured_at: Any = UNSET
    p_value: Any = UNSET
    rounds: Any = UNSET
    shapes: Any = UNSET
    spent_ns: Any = UNSET
    timed_alone: Any = UNSET
    timed_ns: Any = UNSET
    versions: Any = UNSET


class _Entry(Struct, gc=False, omit_defaults=True):
    bucket: str
    confidence: Any
    considered: msgspec.Raw
    device: str
    dtype: str
    environment: msgspec.Raw
    low_confidence: bool
    op: str
    provenance: _Provenance
    ranking: list[_Row]
    rejected: msgspec.Raw
    reverify: bool
    since: Any
    target: str
    tie: bool
    winner: str


_SORTED = msgspec.json.Encoder(order="sorted", enc_hook=lambda v: v._items)
_PLAIN = msgspec.json.Encoder()


def _number(value: Any) -> Any:
    """``value``, or its text as Python writes it where msgspec writes it otherwise: with
    an exponent (``1e16`` is ``1e+16``) or a fraction under 1e-4 (``0.00001`` is
    ``1e-05``). Elsewhere the two agree digit for digit (both the shortest that reads
    back)."""
    if type(value) is float and value and not 1e-4 <= abs(value) < 1e16:
        return msgspec.Raw(repr(value).encode())
    return value


_LATENCIES = attrgetter("max_ns", "median_ns", "min_ns", "q1_ns", "q3_ns", "samples")


def _row(row: RankedCandidate) -> _Row:
    top, median, low, q1, q3, samples = _LATENCIES(row.stats)
    if not (1e-4 <= low and top < 1e16):  # a row is ordered: the least, then the most
        top, median, low, q1, q3 = map(_number, (top, median, low, q1, q3))
    ratio: Any = row.ratio
    if ratio is None:
        ratio = UNSET
    elif not 1e-4 <= ratio < 1e16:
        ratio = _number(ratio)
    return _Row(row.carried, top, median, low, row.name, q1, q3, ratio, samples)


class _Shown:
    """Entries as :class:`_Entry`, each shared object's part made once."""

    def __init__(self) -> None:
        self.raw: dict[int, tuple[Any, msgspec.Raw]] = {}
        self.runs: dict[int, tuple[Run, Any, Any, Any]] = {}
        self.shapes: dict[str, Any] = {}

    def json(self, value: Any) -> msgspec.Raw:
        found = self.raw.get(id(value))
        if found is None:  # the object is kept with its JSON, so its id stays its own
            found = self.raw[id(value)] = (value, msgspec.Raw(_SORTED.encode(value)))
        return found[1]

    def run(self, run: Any) -> tuple[Run, Any, Any, Any]:
        if not isinstance(run, Run):
            run = NO_RUN
        versions = run.get("versions", UNSET)
        found = self.runs[id(run)] = (run, run.get("device_name", UNSET),
                                      run.get("host", UNSET),
                                      versions if versions is UNSET else self.json(versions))
        return found

    def entry(self, e: CacheEntry) -> _Entry:
        prov = e.provenance
        _, device_name, host, versions = self.runs.get(id(prov.run)) or self.run(prov.run)
        measured_at, p_value, rounds, shapes, spent_ns, timed_alone, timed_ns = _OWN(prov)
        if shapes is not UNSET:
            found = self.shapes.get(shapes)
            if found is None:
                found = self.shapes[shapes] = _dimensions(shapes)
            shapes = found
        if p_value is not UNSET and p_value < 1e-4:  # a probability: never 1e16 or more
            p_value = _number(p_value)
        confidence = e.confidence
        if confidence < 1e-4:
            confidence = _number(confidence)
        raw = self.raw
        considered = raw.get(id(e.considered))
        environment = raw.get(id(e.environment))
        rejected = raw.get(id(e.rejected))
        ranking = e.ranking
        return _Entry(
            e.bucket, confidence,
            self.json(e.considered) if considered is None else considered[1],
            e.device, e.dtype,
            self.json(e.environment) if environment is None else environment[1],
            e.low_confidence, e.op,
            _Provenance(device_name, host, measured_at, p_value, rounds, shapes, spent_ns,
                        timed_alone, timed_ns, versions),
            list(map(_row, ranking)),
            self.json(e.rejected) if rejected is None else rejected[1],
            e.reverify, UNSET if e.since == NO_SINCE else e.since, e.target, e.tie,
            ranking[0].name)


_OWN = attrgetter("measured_at", "p_value", "rounds", "shapes", "spent_ns", "timed_alone",
                  "timed_ns")


# What ``json.dumps`` escapes beyond msgspec: DEL and everything past ASCII; a raw line
# break in the indented text is structural (msgspec escapes the ones in strings)
_NOT_ASCII = re.compile(r"[^\n -~]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as json.dumps writes it
    return f"\\u{0xD800 | code >> 10:04x}\\u{0xDC00 | code & 0x3FF:04x}"


def json_chunks(entries: Sequence[CacheEntry]) -> Iterator[bytes]:
    """The JSON array of ``entries`` (with a final line break), in pieces to write one
    after the other."""
    return json_block_chunks([entries])


def json_block_chunks(blocks: Iterable[Sequence[CacheEntry]]) -> Iterator[bytes]:
    """:func:`json_chunks` of the entries of ``blocks``, one after the other: a block
    is encoded once the one before it was written, so the entries of a file read a block
    at a time are never all in memory."""
    shown = _Shown()
    first = True
    for entries in blocks:
        for at in range(0, len(entries), ENTRIES_PER_CHUNK):
            chunk = list(map(shown.entry, entries[at:at + ENTRIES_PER_CHUNK]))
            # a list one indentation level deeper than a top-level array: strip its
            # brackets
            text = msgspec.json.format(_PLAIN.encode(chunk), indent=2)
            if not text.isascii() or b"\x7f" in text:
                text = _NOT_ASCII.sub(_escaped, text.decode("utf-8")).encode("ascii")
            yield b"[\n" if first else b",\n"  # apart: the text is not copied again
            yield text[2:-2]
            first = False
    yield b"[]\n" if first else b"\n]\n"
