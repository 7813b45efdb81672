"""The MeasureCache: measured winners keyed by (device, target, op, bucket, dtype).

The on-disk form (schema ``pytest-arbiter/cache``, version 1, docs/artifacts.md) is
built by :func:`cache_document` and read by :func:`load_entries`. It is deterministic:
entries sorted by key, each an array in the order of ``entry_fields``, each ranking row
one string in the order of ``ranking_fields`` with latencies in whole nanoseconds, the
provenance every entry of one run shares written once in a ``runs`` table. Reading a
document and writing it again gives the same bytes. Loaded entries are validated on
load and build their ranking and provenance objects on first use.
"""

from __future__ import annotations

import gc
import json
import math
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any

from pytest_arbiter.measure import LatencyStats, relative_spread

CACHE_SCHEMA = "pytest-arbiter/cache"
CACHE_VERSION = 2
"""Version 2: an entry is an array, a ranking row a string. Version 1 (an object per
entry, rows arrays of numbers) is still read."""

CacheKey = tuple[str, str, str, str, str]
"""(device, target, op, bucket, dtype)."""

ENTRY_FIELDS = ("device", "target", "op", "bucket", "dtype", "confidence", "tie", "ranking",
                "rejected", "provenance")
"""The fields of one entry in the on-disk form, an array in this order."""

RANKING_FIELDS = ("name", "median_ns", "min_ns", "q1_ns", "q3_ns", "max_ns", "samples")
"""The fields of one ranking row in the on-disk form, a string of them one space apart."""

RUN_FIELDS = ("device_name", "host", "measured_at", "versions")
"""Provenance fields that every entry of one run shares: written once, in ``runs``."""

RUN_REF = "run"
"""The provenance key that points an on-disk entry at its row of ``runs``."""

CONFIDENT = 0.99
"""An entry at or above this confidence (and not a tie) is a clear pick; two clear picks
of different winners for one key are a merge conflict."""


def stable_float(value: float) -> float:
    """``value`` at six significant digits: what the cache artifact stores.

    Applying it twice changes nothing, so a read-then-write round trip is exact.
    """
    return float(f"{value:.6g}") + 0.0  # + 0.0 turns -0.0 into 0.0


@dataclass(frozen=True)
class RankedCandidate:
    """One timed candidate of an entry, fastest first in the entry's ranking."""

    name: str
    stats: LatencyStats

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.stats.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankedCandidate:
        return cls(str(data["name"]), LatencyStats.from_dict(data))


@dataclass(frozen=True)
class CacheEntry:
    """A measured pick for one key, with the full ranking and the evidence behind it."""

    device: str
    target: str
    op: str
    bucket: str
    dtype: str
    ranking: tuple[RankedCandidate, ...]
    confidence: float = 1.0
    tie: bool = False
    rejected: Mapping[str, str] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> CacheKey:
        return (self.device, self.target, self.op, self.bucket, self.dtype)

    @property
    def winner(self) -> str:
        return self.ranking[0].name

    @property
    def samples(self) -> int:
        """How many timed rounds stand behind the winner."""
        return self.ranking[0].stats.samples

    @property
    def spread(self) -> float:
        """The winner's interquartile range relative to its median."""
        return self.ranking[0].stats.spread

    @property
    def confident(self) -> bool:
        """A clear pick: not a tie, and the comparison's confidence reached CONFIDENT."""
        return not self.tie and self.confidence >= CONFIDENT

    def to_dict(self) -> dict[str, Any]:
        """The self-contained form (``pytest-arbiter show --json``, the xdist payload)."""
        return {
            "device": self.device, "target": self.target, "op": self.op,
            "bucket": self.bucket, "dtype": self.dtype, "winner": self.winner,
            "ranking": [r.to_dict() for r in self.ranking],
            "confidence": self.confidence, "tie": self.tie,
            "rejected": dict(sorted(self.rejected.items())),
            "provenance": dict(sorted(self.provenance.items())),
        }

    def canonical(self) -> str:
        """Canonical JSON of :meth:`to_dict`: the merge rule's last tie-break."""
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False,
                          separators=(",", ":"))

    def _values(self) -> tuple[Any, ...]:
        return (self.device, self.target, self.op, self.bucket, self.dtype, self.ranking,
                self.confidence, self.tie, self.rejected, self.provenance)

    def __eq__(self, other: object) -> bool:
        # by content, so an entry read from a file equals the one that was written; the
        # provenance also by its JSON, where 25 and 25.0 or true and 1 differ (the merge
        # rule's last tie-break, the canonical JSON, tells them apart)
        if not isinstance(other, CacheEntry):
            return NotImplemented
        return self._values() == other._values() \
            and _same_json(self.provenance, other.provenance)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CacheEntry:
        ranking = tuple(RankedCandidate.from_dict(r) for r in data["ranking"])
        if not ranking:
            raise ValueError("an entry needs at least one ranked candidate")
        if data.get("winner", ranking[0].name) != ranking[0].name:
            raise ValueError(f"winner {data['winner']!r} is not first in the ranking")
        return cls(str(data["device"]), str(data["target"]), str(data["op"]),
                   str(data["bucket"]), str(data["dtype"]), ranking,
                   float(data.get("confidence", 1.0)), bool(data.get("tie", False)),
                   dict(data.get("rejected", {})), dict(data.get("provenance", {})))


class MeasureCache:
    """Winners by key; O(1) lookups, thread-safe updates, and a version counter that
    tells the arbiter's hot path when a memoised plan is stale."""

    def __init__(self, entries: Iterable[CacheEntry] = ()) -> None:
        self._entries: dict[CacheKey, CacheEntry] = {}
        self._lock = threading.Lock()
        self.version = 0
        for entry in entries:
            self._entries[entry.key] = entry

    @classmethod
    def of_keyed(cls, by_key: dict[CacheKey, CacheEntry]) -> MeasureCache:
        """A cache that takes ``by_key`` over; each value's ``key`` must be its key."""
        cache = cls()
        cache._entries = by_key
        return cache

    def by_key(self) -> dict[CacheKey, CacheEntry]:
        """A snapshot of the entries by key (a new dict)."""
        with self._lock:
            return dict(self._entries)

    def get(self, key: CacheKey) -> CacheEntry | None:
        return self._entries.get(key)

    def put(self, entry: CacheEntry) -> None:
        with self._lock:
            self._entries[entry.key] = entry
            self.version += 1

    def clear(self) -> None:
        """Remove every entry."""
        with self._lock:
            self._entries = {}
            self.version += 1

    def update(self, entries: Iterable[CacheEntry]) -> None:
        with self._lock:
            for entry in entries:
                self._entries[entry.key] = entry
            self.version += 1

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

    def to_dict(self) -> dict[str, Any]:
        return cache_document(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "cache") -> MeasureCache:
        """The cache of a document (its arrays are kept, not copied: pass a freshly parsed
        one); a key listed twice keeps the last entry."""
        keys, entries = load_entries(data, source=source)
        by_key = dict(zip(keys, entries, strict=True))
        return cls.of_keyed(by_key) if len(by_key) == len(entries) else cls(entries)


# -- the on-disk form ---------------------------------------------------------------------
#
# An entry is one JSON array (one line) in the order of ENTRY_FIELDS; each of its ranking
# rows is one string, "name median_ns min_ns q1_ns q3_ns max_ns samples", latencies in
# whole nanoseconds. Far fewer JSON values to parse than an object per entry and an array
# per row: that is most of what loading a large corpus costs (docs/artifacts.md).

_RANKING = ENTRY_FIELDS.index("ranking")
_PROVENANCE = ENTRY_FIELDS.index("provenance")
_KEY_FIELDS = ENTRY_FIELDS[:5]
_RUN_FIELD_SET = frozenset(RUN_FIELDS)
_STATS_FIELDS = RANKING_FIELDS[1:]
_MAX = sys.float_info.max
_new = object.__new__
_set = object.__setattr__
_ABSENT = object()
_DECIMAL = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NO_DIGITS = str.maketrans("", "", "0123456789")
_DIGITS_AS_ZERO = str.maketrans("0123456789", "0" * 10)
_LONG_NUMBER = "0" * 16
"""16 digits in a row: a latency that may not be exactly a float (2^53 has 16)."""
_LEADING_ZERO = re.compile(r" 0(?:[0-9]|\n|\Z)")
"""A field with a leading zero, or a last field (samples) of zero."""
_SIX_SPACES = " " * 6


def latency_ns(value: float) -> int:
    """A latency as the artifact stores it: whole nanoseconds.

    Reading ``2435734`` back gives ``2435734.0``, which is written ``2435734`` again, so
    the read-then-write round trip is exact.
    """
    if not math.isfinite(value):
        raise ValueError(f"a latency must be finite, got {value!r}")
    return round(value)


def ranking_row(candidate: RankedCandidate) -> str:
    """The on-disk row of one ranked candidate (see :data:`RANKING_FIELDS`)."""
    s, ns = candidate.stats, latency_ns
    return (f"{candidate.name} {ns(s.median_ns)} {ns(s.min_ns)} {ns(s.q1_ns)} "
            f"{ns(s.q3_ns)} {ns(s.max_ns)} {s.samples}")


def _field(name: str) -> Any:
    """A read-only attribute that reads field ``name`` of a loaded entry's array."""
    index = ENTRY_FIELDS.index(name)
    return property(lambda self: self._array[index])


class _LoadedEntry(CacheEntry):
    """An entry of a file the fast path validated: it reads its fields from its on-disk
    array and builds its ranking and provenance on first use.

    Creating one costs three slot writes, not a dict and ten attributes: a 100k-entry
    corpus loads in a fraction of the time (docs/performance.md, artifacts).
    """

    __slots__ = ("_array", "_run_texts", "_runs")
    _array: list[Any]
    _runs: list[dict[str, Any]]
    _run_texts: list[str]  # each row of the document's runs as JSON, to compare them

    def __new__(cls, *fields: Any, **named: Any) -> Any:
        # dataclasses.replace() builds a new entry from field values: a plain CacheEntry
        # (a _LoadedEntry only ever comes from a file, through _loaded)
        return CacheEntry(*fields, **named) if fields or named else object.__new__(cls)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_loaded, (self._array, self._runs, self._run_texts))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, CacheEntry) and same_on_disk(self, other)) \
            or super().__eq__(other)

    __hash__ = CacheEntry.__hash__

    def _run_text(self) -> str | None:
        ref = self._array[_PROVENANCE].get(RUN_REF)
        return None if ref is None else self._run_texts[ref]

    if not TYPE_CHECKING:  # to mypy these are the dataclass's fields, which they serve
        device, target, op = _field("device"), _field("target"), _field("op")
        bucket, dtype = _field("bucket"), _field("dtype")
        confidence, tie, rejected = _field("confidence"), _field("tie"), _field("rejected")

        @property
        def ranking(self) -> tuple[RankedCandidate, ...]:
            built = self.__dict__.get("ranking")
            if built is None:
                built = self.__dict__["ranking"] = tuple(
                    map(_candidate, self._array[_RANKING]))
            return built

        @property
        def provenance(self) -> dict[str, Any]:
            built = self.__dict__.get("provenance")
            if built is None:
                built = self.__dict__["provenance"] = _provenance_of(
                    self._array[_PROVENANCE], self._runs)
            return built

    @property
    def key(self) -> CacheKey:
        device, target, op, bucket, dtype = self._array[:5]
        return (device, target, op, bucket, dtype)

    def raw_ranking(self) -> list[str] | None:
        """The on-disk ranking rows, while the ranking is not built."""
        return None if "ranking" in self.__dict__ else self._array[_RANKING]

    def raw_provenance(self) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The on-disk provenance and the document's ``runs``, while not built."""
        if "provenance" in self.__dict__:
            return None
        return (self._array[_PROVENANCE], self._runs)


def same_on_disk(a: CacheEntry, b: CacheEntry) -> bool:
    """Two entries read from files in the same on-disk form, so with the same values:
    told without building either (what makes merging a corpus with itself cheap)."""
    if not (isinstance(a, _LoadedEntry) and isinstance(b, _LoadedEntry)
            and a._array == b._array and a._run_text() == b._run_text()):
        return False
    # every other field has one JSON type on the fast path, so == is exact there; the
    # provenance's numbers may not be (25 == 25.0): its repr tells them apart, and is
    # the same for two files only when they list its keys in the same order (the
    # writer sorts them), else the entries are compared in full
    return repr(a._array[_PROVENANCE]) == repr(b._array[_PROVENANCE])


_json_text = json.JSONEncoder(sort_keys=True).encode


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON: ``==``, and the same text (``25`` is not ``25.0``, nor ``true`` 1).
    Values JSON cannot write (an entry built in memory may hold them) compare by ``==``."""
    if a != b:
        return False
    try:
        return a is b or _json_text(a) == _json_text(b)
    except (TypeError, ValueError):
        return True


def _loaded(array: list[Any], runs: list[dict[str, Any]], run_texts: list[str]) -> CacheEntry:
    entry = _new(_LoadedEntry)
    _set(entry, "_array", array)
    _set(entry, "_runs", runs)
    _set(entry, "_run_texts", run_texts)
    return entry


def _candidate(row: str) -> RankedCandidate:
    """A ranking row the fast path validated, as a RankedCandidate."""
    name, median, low, q1, q3, high, samples = row.rsplit(" ", 6)
    return RankedCandidate(name, LatencyStats(float(median), float(low), float(q1),
                                              float(q3), float(high), int(samples)))


def _provenance_of(prov: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    if RUN_REF not in prov:
        return dict(prov)
    rest = dict(prov)
    return {**runs[rest.pop(RUN_REF)], **rest}


def evidence(entry: CacheEntry) -> tuple[float, int, float]:
    """(confidence, samples, -spread) of the winner: what the merge rule compares.

    Read from the on-disk row of a loaded entry whose ranking is not built yet.
    """
    rows = entry.raw_ranking() if type(entry) is _LoadedEntry else None
    if rows is None:
        stats = entry.ranking[0].stats
        return (entry.confidence, stats.samples, -stats.spread)
    _, median, _, q1, q3, _, samples = rows[0].rsplit(" ", 6)
    spread = relative_spread(float(median), float(q1), float(q3))
    return (entry.confidence, int(samples), -spread)


def _disk_rows(entry: CacheEntry) -> list[str]:
    rows = entry.raw_ranking() if type(entry) is _LoadedEntry else None
    return list(rows) if rows is not None else [ranking_row(c) for c in entry.ranking]


def cache_document(entries: Iterable[CacheEntry]) -> dict[str, Any]:
    """The on-disk document of ``entries``: sorted, whole-nanosecond latencies, shared
    provenance once.

    Each entry's provenance fields named in :data:`RUN_FIELDS` go to one row of ``runs``
    (rows sorted by their canonical JSON); the entry keeps ``"run": index`` and its own
    fields (rounds, timed_ns, shapes, ...). An entry is an array in the order of
    ``entry_fields`` (:data:`ENTRY_FIELDS`), its ranking rows strings in the order of
    ``ranking_fields`` (:data:`RANKING_FIELDS`).
    """
    by_key = sorted(entries, key=lambda e: e.key)
    shared: list[tuple[CacheEntry, dict[str, Any], str | None]] = []
    runs: dict[str, dict[str, Any]] = {}
    tags: dict[int, str] = {}  # id of a loaded runs row -> its tag
    for entry in by_key:
        raw = entry.raw_provenance() if type(entry) is _LoadedEntry else None
        tag: str | None
        if raw is not None:
            # a loaded entry: its run row is shared, so its tag is computed once
            prov_raw, src_runs = raw
            ref = prov_raw.get(RUN_REF)
            if ref is not None and src_runs[ref] and _RUN_FIELD_SET.isdisjoint(prov_raw) \
                    and _RUN_FIELD_SET.issuperset(src_runs[ref]):
                row = src_runs[ref]
                tag = tags.get(id(row))
                if tag is None:
                    tag = tags[id(row)] = json.dumps(row, sort_keys=True, allow_nan=False)
                    runs.setdefault(tag, row)
                prov = dict(prov_raw)
                del prov[RUN_REF]
                shared.append((entry, prov, tag))
                continue
        prov = dict(entry.provenance)
        if RUN_REF in prov:
            raise ValueError(f"{'/'.join(entry.key)}: provenance key {RUN_REF!r} is reserved")
        run = {k: prov.pop(k) for k in RUN_FIELDS if k in prov}
        tag = json.dumps(run, sort_keys=True, allow_nan=False) if run else None
        if tag is not None:
            runs.setdefault(tag, run)
        shared.append((entry, prov, tag))
    order = sorted(runs)
    index = {tag: i for i, tag in enumerate(order)}
    rows = []
    for entry, prov, tag in shared:
        if tag is not None:
            prov[RUN_REF] = index[tag]
        rows.append([entry.device, entry.target, entry.op, entry.bucket, entry.dtype,
                     stable_float(entry.confidence), bool(entry.tie), _disk_rows(entry),
                     dict(entry.rejected), prov])
    return {"schema": CACHE_SCHEMA, "version": CACHE_VERSION,
            "entry_fields": list(ENTRY_FIELDS), "ranking_fields": list(RANKING_FIELDS),
            "runs": [runs[tag] for tag in order], "entries": rows}


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many objects at once.

    Loading 100k entries allocates millions of objects, none of them cyclic; each
    collection the allocations would trigger scans them all again (profiled: most of
    the load time). Restores the previous state.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# -- reading: a fast check of the whole document, else entry by entry ---------------------


def _types(values: Iterable[Any]) -> set[type]:
    return set(map(type, values))


def _rows_valid(rows: list[Any]) -> bool:
    """Every ranking row in the writer's exact form, checked in C loops over all rows
    at once: a name without a line break, a double space or a space at either end, then
    six whole numbers one space apart, in ASCII digits, without a leading zero or a
    16th digit (so each is exactly a float), the last (samples) not zero. A row is split
    at its last six spaces, as the precise path splits it.

    Anything else (a decimal, a leading zero, an array) is left to :func:`_parse_row`,
    which reads every valid form and names what is wrong.
    """
    if _types(rows) != {str}:
        return False
    text = "\n".join(rows)
    if text.count("\n") != len(rows) - 1:
        return False  # a row with a line break: the lines of text below must be the rows
    spaced = text.replace("\n", " ")
    if spaced[0] == " " or spaced[-1] == " " or "  " in spaced:
        return False  # an empty field
    if _LEADING_ZERO.search(text) or _LONG_NUMBER in text.translate(_DIGITS_AS_ZERO):
        return False
    # without its digits a row ends in six spaces only if its last six fields are digits
    letters = text.translate(_NO_DIGITS)
    return letters.endswith(_SIX_SPACES) and letters.count(_SIX_SPACES + "\n") == len(rows) - 1


def _load_fast(raw: list[Any], runs: list[dict[str, Any]]
               ) -> tuple[list[CacheKey], list[CacheEntry]] | None:
    """(keys, entries) if every entry of ``raw`` is in the writer's exact form (an array
    of :data:`ENTRY_FIELDS`, a float confidence, rows as :func:`_rows_valid` says), else
    None.

    The checks run column by column and row by row in C loops, and they are those of
    :func:`_parse_entry`, which finds and names the first bad entry when this says None
    (or reads a hand-written file in another valid form).
    """
    if not raw:
        return [], []
    if _types(raw) != {list} or set(map(len, raw)) != {len(ENTRY_FIELDS)}:
        return None
    columns = list(zip(*raw, strict=True))
    device, target, op, bucket, dtype, confidence, tie, ranking, rejected, prov = columns
    if any(_types(column) != {str} for column in columns[:5]):
        return None
    if _types(confidence) != {float} or not 0.0 <= min(confidence) <= max(confidence) <= 1.0 \
            or math.isnan(sum(confidence)):  # min and max step over a NaN that is not first
        return None
    if _types(tie) != {bool} or _types(rejected) != {dict} or _types(prov) != {dict}:
        return None
    if not _types(chain.from_iterable(map(dict.values, rejected))) <= {str}:
        return None
    refs = [r for r in map(dict.get, prov, repeat(RUN_REF), repeat(_ABSENT)) if r is not _ABSENT]
    if refs and (_types(refs) != {int} or min(refs) < 0 or max(refs) >= len(runs)):
        return None
    if _types(ranking) != {list} or min(map(len, ranking)) < 1:
        return None
    if not _rows_valid(list(chain.from_iterable(ranking))):
        return None
    keys = list(zip(device, target, op, bucket, dtype, strict=True))
    run_texts = list(map(_json_text, runs))
    return keys, list(map(_loaded, raw, repeat(runs), repeat(run_texts)))


def _number(value: Any, what: str) -> float:
    if type(value) is not float and type(value) is not int:
        raise ValueError(f"{what} must be a number, got {value!r}")
    if not 0 <= value <= _MAX:
        raise ValueError(f"{what} must be finite and non-negative, got {value!r}")
    return float(value)


def _row_values(row: Any) -> list[Any]:
    """The values of a ranking row: a string of them one space apart (split at its last
    six spaces; numbers in decimal notation), or an array of them."""
    if type(row) is str:
        values: list[Any] = row.rsplit(" ", len(RANKING_FIELDS) - 1)
        if len(values) == len(RANKING_FIELDS):
            *_, samples = values
            values[1:-1] = [float(v) if _DECIMAL.fullmatch(v) else v for v in values[1:-1]]
            if samples.isascii() and samples.isdigit():
                values[-1] = int(samples)
    else:
        values = row
    if type(values) is not list or len(values) != len(RANKING_FIELDS):
        raise ValueError(f"a ranking row must be a string '{' '.join(RANKING_FIELDS)}' or "
                         f"an array of those {len(RANKING_FIELDS)} values, got {row!r}")
    return values


def _parse_row(row: Any) -> RankedCandidate:
    name, *latencies, samples = _row_values(row)
    if type(name) is not str or not name:
        raise ValueError(f"candidate name must be a non-empty string, got {name!r}")
    if type(samples) is not int or samples < 1:
        raise ValueError(f"{name}: samples must be a positive integer, got {samples!r}")
    median, low, q1, q3, high = (_number(value, f"{name}: {field_name}")
                                 for field_name, value in zip(_STATS_FIELDS[:-1], latencies,
                                                              strict=True))
    return RankedCandidate(name, LatencyStats(median, low, q1, q3, high, samples))


def _parse_entry(item: Any, runs: list[dict[str, Any]]) -> CacheEntry:
    """One entry, checked field by field and built now (the slow, precise path).

    Reads the writer's form (an array of :data:`ENTRY_FIELDS`) and the hand-written one
    (an object of those fields, all but the key and ``ranking`` optional, and an optional
    ``winner`` that must be first in the ranking); rows as strings or arrays.
    """
    if type(item) is list:
        if len(item) != len(ENTRY_FIELDS):
            raise ValueError(f"an entry array must have {len(ENTRY_FIELDS)} values "
                             f"({', '.join(ENTRY_FIELDS)}), got {len(item)}")
        item = dict(zip(ENTRY_FIELDS, item, strict=True))
    elif type(item) is not dict:
        raise ValueError(f"an entry must be an array or an object, got {type(item).__name__}")
    unknown = set(item) - {*ENTRY_FIELDS, "winner"}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    for name in _KEY_FIELDS:
        value = item.get(name)
        if type(value) is not str:
            raise ValueError(f"{name!r} must be a string, got {value!r}")
    raw = item.get("ranking")
    if type(raw) is not list or not raw:
        raise ValueError("'ranking' must be a non-empty list")
    ranking = tuple([_parse_row(row) for row in raw])
    winner = item.get("winner", ranking[0].name)
    if winner != ranking[0].name:
        raise ValueError(f"winner {winner!r} is not first in the ranking")
    confidence = item.get("confidence", 1.0)
    if type(confidence) is not float and type(confidence) is not int:
        raise ValueError(f"'confidence' must be a number, got {confidence!r}")
    if not 0.0 <= confidence <= 1.0:
        raise ValueError(f"'confidence' must be in [0, 1], got {confidence!r}")
    tie = item.get("tie", False)
    if type(tie) is not bool:
        raise ValueError(f"'tie' must be true or false, got {tie!r}")
    rejected = item.get("rejected", {})
    if type(rejected) is not dict or not all(type(v) is str for v in rejected.values()):
        raise ValueError(f"'rejected' must map candidate names to reasons, got {rejected!r}")
    prov = item.get("provenance", {})
    if type(prov) is not dict:
        raise ValueError(f"'provenance' must be an object, got {prov!r}")
    if RUN_REF in prov:
        ref = prov[RUN_REF]
        if type(ref) is not int or not 0 <= ref < len(runs):
            raise ValueError(f"provenance 'run' {ref!r} is not an index into 'runs' "
                             f"(which has {len(runs)} rows)")
    return CacheEntry(item["device"], item["target"], item["op"], item["bucket"],
                      item["dtype"], ranking, float(confidence), tie, rejected,
                      _provenance_of(prov, runs))


def load_entries(data: Mapping[str, Any], *, source: str = "cache"
                 ) -> tuple[list[CacheKey], list[CacheEntry]]:
    """Parse a cache document into (keys, entries); ``ValueError`` naming ``source`` and
    the first bad entry's index.

    Every entry is validated here. When the whole document is in the writer's exact form
    (:func:`_load_fast`: every check a C loop over a column or over all ranking rows),
    each entry reads its fields from its on-disk array and builds its ranking and
    provenance objects on first use; otherwise each entry is checked and built one by
    one, which also names the first bad one. The entries keep the document's arrays:
    pass a freshly parsed document and leave it alone.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != CACHE_SCHEMA:
        raise ValueError(f"{source}: schema is {data.get('schema')!r}, expected {CACHE_SCHEMA!r}")
    version = data.get("version")
    if type(version) is not int or version < 1:
        raise ValueError(f"{source}: cache version {version!r} is not a positive integer")
    if version > CACHE_VERSION:
        raise ValueError(f"{source}: cache schema version {version} is newer than version "
                         f"{CACHE_VERSION}, the newest this pytest-arbiter reads; upgrade it")
    for header, expected in (("entry_fields", ENTRY_FIELDS), ("ranking_fields", RANKING_FIELDS)):
        order = data.get(header, list(expected))
        if order != list(expected):
            raise ValueError(f"{source}: {header!r} is {order!r}, expected {list(expected)!r}")
    runs = data.get("runs", [])
    if type(runs) is not list or not all(type(r) is dict for r in runs):
        raise ValueError(f"{source}: 'runs' must be a list of objects")
    raw = data.get("entries")
    if type(raw) is not list:
        raise ValueError(f"{source}: 'entries' must be a list")
    with gc_paused():
        fast = _load_fast(raw, runs)
        if fast is not None:
            return fast
        entries: list[CacheEntry] = []
        for i, item in enumerate(raw):
            try:
                entries.append(_parse_entry(item, runs))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{source}: entries[{i}] is invalid: {exc}") from None
        return [e.key for e in entries], entries
