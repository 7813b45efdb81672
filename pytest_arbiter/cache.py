"""The MeasureCache: measured winners keyed by (device, target, op, bucket, dtype).

The on-disk form (schema ``pytest-arbiter/cache``, version 1, docs/artifacts.md) is
built by :func:`cache_document` and read by :func:`load_entries`. It is deterministic:
entries sorted by key, ranking rows as arrays in the order of ``ranking_fields``,
latencies written with six significant digits (integral ones as integers), the
provenance every entry of one run shares written once in a ``runs`` table. Reading a
document and writing it again gives the same bytes. Loaded entries are validated on
load and build their ranking and provenance objects on first use.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from itertools import chain
from typing import TYPE_CHECKING, Any

from pytest_arbiter.measure import LatencyStats

CACHE_SCHEMA = "pytest-arbiter/cache"
CACHE_VERSION = 1

CacheKey = tuple[str, str, str, str, str]
"""(device, target, op, bucket, dtype)."""

RANKING_FIELDS = ("name", "median_ns", "min_ns", "q1_ns", "q3_ns", "max_ns", "samples")
"""The fields of one ranking row in the on-disk form."""

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

    if not TYPE_CHECKING:  # hidden from mypy, so a misspelt attribute stays an error
        def __getattr__(self, name: str) -> Any:
            # Only called for attributes missing from the instance: an entry loaded from
            # a file (entries_from_dict) keeps its validated raw ranking rows and
            # provenance, and builds the objects on first use (docs/artifacts.md).
            d = self.__dict__
            if name == "ranking" and _RAW_RANKING in d:
                value: Any = _ranking_of(d[_RAW_RANKING])
            elif name == "provenance" and _RAW_PROVENANCE in d:
                value = _provenance_of(*d[_RAW_PROVENANCE])
            else:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute "
                                     f"{name!r}")
            return d.setdefault(name, value)

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
        """The cache of a document (consumed); a key listed twice keeps the last entry."""
        keys, entries = load_entries(data, source=source)
        by_key = dict(zip(keys, entries, strict=True))
        return cls.of_keyed(by_key) if len(by_key) == len(entries) else cls(entries)


# -- the on-disk form ---------------------------------------------------------------------
#
# An entry is one JSON object (one line) with the fields of _ENTRY_KEYS; its ranking rows
# are arrays in the order of RANKING_FIELDS (the document says so in "ranking_fields"),
# latencies at six significant digits, written as integers when they are integral.

_EXACT = float(2**53)
_RAW_RANKING = "_rows"
_RAW_PROVENANCE = "_prov"
_ENTRY_KEYS = ("bucket", "confidence", "device", "dtype", "op", "provenance", "ranking",
               "rejected", "target", "tie", "winner")
_RUN_FIELD_SET = frozenset(RUN_FIELDS)
_STATS_FIELDS = RANKING_FIELDS[1:]
_new = object.__new__
_set = object.__setattr__
_MAX = sys.float_info.max
_KEY_FIELDS = ("device", "target", "op", "bucket", "dtype")
_ENTRY_FIELDS = frozenset(f.name for f in fields(CacheEntry))
# The frozen dataclasses here are plain (no slots, no __post_init__), so an instance can
# adopt a dict as its __dict__: no object.__setattr__ per field. Checked, not assumed.
_ADOPT_STATS = (tuple(f.name for f in fields(LatencyStats)) == _STATS_FIELDS
                and not hasattr(LatencyStats, "__post_init__")
                and not hasattr(LatencyStats, "__slots__"))


def latency_number(value: float) -> float | int:
    """A latency as the artifact stores it: ``stable_float``, an int when integral.

    ``2588610.0`` is written ``2588610``; reading it back gives the same float, so the
    read-then-write round trip stays exact.
    """
    v = stable_float(value)
    return int(v) if v.is_integer() and -_EXACT < v < _EXACT else v


def _adopt(cls: type[Any], values: dict[str, Any]) -> Any:
    obj = _new(cls)
    _set(obj, "__dict__", values)
    return obj


def _candidate(row: list[Any]) -> RankedCandidate:
    """A ranking row (already validated) as a RankedCandidate."""
    name, median, low, q1, q3, high, samples = row
    if _ADOPT_STATS:
        stats = _adopt(LatencyStats, {"median_ns": float(median), "min_ns": float(low),
                                      "q1_ns": float(q1), "q3_ns": float(q3),
                                      "max_ns": float(high), "samples": samples})
    else:  # pragma: no cover - LatencyStats grew slots or a __post_init__
        stats = LatencyStats(float(median), float(low), float(q1), float(q3), float(high),
                             samples)
    cand: RankedCandidate = _adopt(RankedCandidate, {"name": name, "stats": stats})
    return cand


def _ranking_of(rows: list[list[Any]]) -> tuple[RankedCandidate, ...]:
    return tuple([_candidate(row) for row in rows])


def _provenance_of(prov: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    if RUN_REF not in prov:
        return dict(prov)
    rest = dict(prov)
    return {**runs[rest.pop(RUN_REF)], **rest}


def _lazy(entry: CacheEntry, name: str) -> Any:
    """The raw (validated, not yet built) form of ``name`` of a loaded entry, or None."""
    d = entry.__dict__
    return None if name in d else d.get(
        _RAW_RANKING if name == "ranking" else _RAW_PROVENANCE)


def evidence(entry: CacheEntry) -> tuple[float, int, float]:
    """(confidence, samples, -spread) of the winner: what the merge rule compares.

    Read from the raw ranking row of an entry not built yet (the same numbers).
    """
    rows = _lazy(entry, "ranking")
    if rows is None:
        stats = entry.ranking[0].stats
        return (entry.confidence, stats.samples, -stats.spread)
    _, median, _, q1, q3, _, samples = rows[0]
    median = float(median)
    spread = (float(q3) - float(q1)) / median if median > 0 else 0.0
    return (entry.confidence, samples, -spread)


def _disk_rows(entry: CacheEntry) -> list[list[Any]]:
    rows = _lazy(entry, "ranking")
    num = latency_number
    if rows is not None:
        return [[r[0], num(r[1]), num(r[2]), num(r[3]), num(r[4]), num(r[5]), r[6]]
                for r in rows]
    out = []
    for cand in entry.ranking:
        s = cand.stats
        out.append([cand.name, num(s.median_ns), num(s.min_ns), num(s.q1_ns),
                    num(s.q3_ns), num(s.max_ns), s.samples])
    return out


def cache_document(entries: Iterable[CacheEntry]) -> dict[str, Any]:
    """The on-disk document of ``entries``: sorted, stable numbers, shared provenance once.

    Each entry's provenance fields named in :data:`RUN_FIELDS` go to one row of ``runs``
    (rows sorted by their canonical JSON); the entry keeps ``"run": index`` and its own
    fields (rounds, timed_ns, shapes, ...). Ranking rows are arrays in the order of
    ``ranking_fields`` (:data:`RANKING_FIELDS`).
    """
    by_key = sorted(entries, key=lambda e: e.key)
    shared: list[tuple[CacheEntry, dict[str, Any], str | None]] = []
    runs: dict[str, dict[str, Any]] = {}
    tags: dict[int, str] = {}  # id of a loaded runs row -> its tag
    for entry in by_key:
        raw = _lazy(entry, "provenance")
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
        ranking = _disk_rows(entry)
        rows.append({
            "device": entry.device, "target": entry.target, "op": entry.op,
            "bucket": entry.bucket, "dtype": entry.dtype, "winner": ranking[0][0],
            "ranking": ranking,
            "confidence": stable_float(entry.confidence), "tie": bool(entry.tie),
            "rejected": dict(entry.rejected), "provenance": prov,
        })
    return {"schema": CACHE_SCHEMA, "version": CACHE_VERSION,
            "ranking_fields": list(RANKING_FIELDS),
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


def _finite_non_negative(numbers: list[Any]) -> bool:
    """Every value an int or float (not a bool), finite and non-negative.

    ``sum`` refuses what is not a number and turns NaN and infinities (and ints too
    large for a float) into a non-finite sum or an OverflowError; ``min`` finds a
    negative. A bool counts as 0 or 1 in both, so only when the smallest value is at
    most 1 are the types checked one by one.
    """
    if not numbers:
        return True
    try:
        total = sum(numbers)
    except (TypeError, OverflowError):
        return False
    if not 0 <= total <= _MAX:
        return False
    least = min(numbers)
    return least > 1 or (least >= 0 and _types(numbers) <= {int, float})


def _rows_valid(ranking: list[list[Any]]) -> bool:
    """Every ranking row of every entry valid (see :func:`_parse_row`), in C loops."""
    rows = list(chain.from_iterable(ranking))
    width = len(RANKING_FIELDS)
    if set(map(len, rows)) != {width}:
        return False
    # rows of `width` values, flattened: a row that is an object or a string puts
    # strings among the numbers, which _finite_non_negative refuses
    flat = list(chain.from_iterable(rows))
    names, samples = flat[0::width], flat[width - 1::width]
    "".join(names)  # refuses anything but strings
    if not all(names) or _types(samples) != {int} or min(samples) < 1:
        return False
    return all(_finite_non_negative(flat[i::width]) for i in range(1, width - 1))


def _unload(entries: list[CacheEntry]) -> None:
    """Give the dicts :func:`_load_fast` adopted back their on-disk form."""
    for entry in entries:
        item = entry.__dict__
        rows = item.pop(_RAW_RANKING)
        item["ranking"] = rows
        item["provenance"] = item.pop(_RAW_PROVENANCE)[0]
        item["winner"] = rows[0][0]


def _load_fast(raw: list[Any], runs: list[dict[str, Any]]
               ) -> tuple[list[CacheKey], list[CacheEntry]] | None:
    """(keys, entries) if every entry of ``raw`` is valid in the exact form the writer
    writes (all fields present, none unknown, a float confidence), else None, with
    ``raw`` as it was.

    One pass over the entries checks their fields and adopts each dict as a
    CacheEntry that keeps its raw ranking rows and provenance (built on first use);
    the rows of all entries are then checked at once, in C loops. The checks are those
    of :func:`_parse_entry`, which finds and names the first bad entry when this says
    None (or reads a hand-written file in another valid form).
    """
    n_runs = len(runs)
    keys: list[CacheKey] = []
    entries: list[CacheEntry] = []
    rankings: list[list[Any]] = []
    add_key, add_entry, add_ranking = keys.append, entries.append, rankings.append
    n_fields = len(_ENTRY_KEYS)
    kind, str_, dict_, list_ = type, str, dict, list
    try:
        for item in raw:
            if kind(item) is not dict_ or len(item) != n_fields:
                raise TypeError  # not an object, or a field missing or unknown
            device, target, op = item["device"], item["target"], item["op"]
            bucket, dtype = item["bucket"], item["dtype"]
            if not (kind(device) is kind(target) is kind(op) is kind(bucket) is kind(dtype)
                    is str_):
                raise TypeError
            confidence = item["confidence"]
            if kind(confidence) is not float or not 0.0 <= confidence <= 1.0 \
                    or kind(item["tie"]) is not bool:
                raise TypeError
            rejected = item["rejected"]
            if kind(rejected) is not dict_ or (rejected and _types(rejected.values())
                                                != {str_}):
                raise TypeError
            prov = item["provenance"]
            if kind(prov) is not dict_:
                raise TypeError
            if RUN_REF in prov:
                ref = prov[RUN_REF]
                if kind(ref) is not int or not 0 <= ref < n_runs:
                    raise TypeError
            rows = item["ranking"]
            if kind(rows) is not list_ or not rows or item["winner"] != rows[0][0]:
                raise TypeError
            # valid so far: adopt the dict (the rows are checked below, all at once)
            del item["ranking"], item["provenance"], item["winner"]
            item[_RAW_RANKING] = rows
            item[_RAW_PROVENANCE] = (prov, runs)
            entry = _new(CacheEntry)
            _set(entry, "__dict__", item)
            add_entry(entry)
            add_key((device, target, op, bucket, dtype))
            add_ranking(rows)
        if _rows_valid(rankings):
            return keys, entries
    except (TypeError, KeyError, IndexError, ValueError, OverflowError):
        pass
    _unload(entries)
    return None


def _number(value: Any, what: str) -> float:
    kind = type(value)
    if kind is float or kind is int:
        if not 0 <= value <= _MAX:
            raise ValueError(f"{what} must be finite and non-negative, got {value!r}")
        return float(value)
    raise ValueError(f"{what} must be a number, got {value!r}")


def _parse_row(row: Any) -> RankedCandidate:
    if type(row) is not list or len(row) != len(RANKING_FIELDS):
        raise ValueError(f"a ranking row must be a list of {len(RANKING_FIELDS)} values "
                         f"({', '.join(RANKING_FIELDS)}), got {row!r}")
    name, samples = row[0], row[-1]
    if type(name) is not str or not name:
        raise ValueError(f"candidate name must be a non-empty string, got {name!r}")
    if type(samples) is not int or samples < 1:
        raise ValueError(f"{name}: samples must be a positive integer, got {samples!r}")
    for field_name, value in zip(_STATS_FIELDS[:5], row[1:6], strict=True):
        _number(value, f"{name}: {field_name}")
    return _candidate(row)


def _parse_entry(item: Any, runs: list[dict[str, Any]]) -> CacheEntry:
    """One entry, checked field by field and built now (the slow, precise path)."""
    if type(item) is not dict:
        raise ValueError(f"an entry must be an object, got {type(item).__name__}")
    for name in _KEY_FIELDS:
        value = item.get(name)
        if type(value) is not str:
            raise ValueError(f"{name!r} must be a string, got {value!r}")
    raw = item.get("ranking")
    if type(raw) is not list or not raw:
        raise ValueError("'ranking' must be a non-empty list")
    ranking = tuple([_parse_row(row) for row in raw])
    winner = item.pop("winner", ranking[0].name)
    if winner != ranking[0].name:
        raise ValueError(f"winner {winner!r} is not first in the ranking")
    item["ranking"] = ranking
    confidence = item.setdefault("confidence", 1.0)
    if type(confidence) is not float:
        if type(confidence) is not int:
            raise ValueError(f"'confidence' must be a number, got {confidence!r}")
        confidence = item["confidence"] = float(confidence)
    if not 0.0 <= confidence <= 1.0:
        raise ValueError(f"'confidence' must be in [0, 1], got {confidence!r}")
    if type(item.setdefault("tie", False)) is not bool:
        raise ValueError(f"'tie' must be true or false, got {item['tie']!r}")
    rejected = item.setdefault("rejected", {})
    if type(rejected) is not dict or not all(type(v) is str for v in rejected.values()):
        raise ValueError(f"'rejected' must map candidate names to reasons, got {rejected!r}")
    prov = item.setdefault("provenance", {})
    if type(prov) is not dict:
        raise ValueError(f"'provenance' must be an object, got {prov!r}")
    if RUN_REF in prov:
        ref = prov.pop(RUN_REF)
        if type(ref) is not int or not 0 <= ref < len(runs):
            raise ValueError(f"provenance 'run' {ref!r} is not an index into 'runs' "
                             f"(which has {len(runs)} rows)")
        item["provenance"] = {**runs[ref], **prov}
    if len(item) != len(_ENTRY_FIELDS):
        raise ValueError(f"unknown fields {sorted(set(item) - _ENTRY_FIELDS)}")
    entry: CacheEntry = _adopt(CacheEntry, item)
    return entry


def load_entries(data: Mapping[str, Any], *, source: str = "cache"
                 ) -> tuple[list[CacheKey], list[CacheEntry]]:
    """Parse a cache document into (keys, entries); ``ValueError`` naming ``source`` and
    the first bad entry's index.

    Every entry is validated here. When the whole document is in the writer's exact form
    (:func:`_load_fast`: one pass over the entries, then all ranking rows in C loops),
    each entry keeps its validated raw ranking rows and provenance and builds those
    objects on first use; otherwise each entry is checked and built one by one, which
    also names the first bad one. The entries adopt
    the document's dicts (it is consumed): pass a freshly parsed one.
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
    order = data.get("ranking_fields", list(RANKING_FIELDS))
    if order != list(RANKING_FIELDS):
        raise ValueError(f"{source}: 'ranking_fields' is {order!r}, expected "
                         f"{list(RANKING_FIELDS)!r}")
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


def entries_from_dict(data: Mapping[str, Any], *, source: str = "cache") -> list[CacheEntry]:
    """Parse a cache document (see :func:`load_entries`)."""
    return load_entries(data, source=source)[1]
