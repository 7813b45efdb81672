"""The MeasureCache: measured winners keyed by (device, target, op, bucket, dtype).

The on-disk form (schema ``pytest-arbiter/cache``, version 1, docs/artifacts.md) is
built by :func:`cache_document` and read by :func:`entries_from_dict`. It is
deterministic: entries sorted by key, latencies written with six significant digits,
the provenance every entry of one run shares written once in a ``runs`` table. Reading
a document and writing it again gives the same bytes.
"""

from __future__ import annotations

import gc
import json
import math
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from operator import itemgetter
from typing import Any

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
        return cls(entries_from_dict(data, source=source))


# -- the on-disk form ---------------------------------------------------------------------


def _row(cand: RankedCandidate) -> dict[str, Any]:
    s = cand.stats
    return {"name": cand.name, "median_ns": stable_float(s.median_ns),
            "min_ns": stable_float(s.min_ns), "q1_ns": stable_float(s.q1_ns),
            "q3_ns": stable_float(s.q3_ns), "max_ns": stable_float(s.max_ns),
            "samples": s.samples}


def cache_document(entries: Iterable[CacheEntry]) -> dict[str, Any]:
    """The on-disk document of ``entries``: sorted, stable floats, shared provenance once.

    Each entry's provenance fields named in :data:`RUN_FIELDS` go to one row of ``runs``
    (rows sorted by their canonical JSON); the entry keeps ``"run": index`` and its own
    fields (rounds, timed_ns, shapes, ...).
    """
    by_key = sorted(entries, key=lambda e: e.key)
    shared: list[tuple[CacheEntry, dict[str, Any], str | None]] = []
    runs: dict[str, dict[str, Any]] = {}
    for entry in by_key:
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
        rows.append({
            "device": entry.device, "target": entry.target, "op": entry.op,
            "bucket": entry.bucket, "dtype": entry.dtype, "winner": entry.winner,
            "ranking": [_row(r) for r in entry.ranking],
            "confidence": stable_float(entry.confidence), "tie": bool(entry.tie),
            "rejected": dict(entry.rejected), "provenance": prov,
        })
    return {"schema": CACHE_SCHEMA, "version": CACHE_VERSION,
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


_new = object.__new__
_set = object.__setattr__
_INF = math.inf
_KEY_FIELDS = ("device", "target", "op", "bucket", "dtype")
_STATS_FIELDS = RANKING_FIELDS[1:]
_numbers_of = itemgetter(*_STATS_FIELDS[:5])
_ENTRY_FIELDS = frozenset(f.name for f in fields(CacheEntry))
# Loading a large cache is dominated by object creation. The frozen dataclasses here are
# plain (no slots, no __post_init__), so an instance can adopt the freshly parsed dict
# as its __dict__: no copy, no object.__setattr__ per field. Checked here, not assumed.
_ADOPT_STATS = (tuple(f.name for f in fields(LatencyStats)) == _STATS_FIELDS
                and not hasattr(LatencyStats, "__post_init__")
                and not hasattr(LatencyStats, "__slots__"))


def _adopt(cls: type[Any], values: dict[str, Any]) -> Any:
    obj = _new(cls)
    _set(obj, "__dict__", values)
    return obj


def _number(value: Any, what: str) -> float:
    kind = type(value)
    if kind is float or kind is int:
        if not 0 <= value < _INF:
            raise ValueError(f"{what} must be finite and non-negative, got {value!r}")
        return float(value)
    raise ValueError(f"{what} must be a number, got {value!r}")


def _parse_row(row: Any) -> RankedCandidate:
    if type(row) is not dict:
        raise ValueError(f"a ranking row must be an object, got {row!r}")
    name = row.pop("name", None)
    if type(name) is not str or not name:
        raise ValueError(f"candidate name must be a non-empty string, got {name!r}")
    samples = row.get("samples")
    if type(samples) is not int or samples < 1:
        raise ValueError(f"{name}: samples must be a positive integer, got {samples!r}")
    try:
        numbers = _numbers_of(row)
    except KeyError as exc:
        raise ValueError(f"{name}: {exc.args[0]!r} is missing") from None
    if len(row) != len(_STATS_FIELDS):
        extra = sorted(set(row) - set(_STATS_FIELDS))
        raise ValueError(f"{name}: unknown ranking fields {extra}")
    if not (type(numbers[0]) is type(numbers[1]) is type(numbers[2]) is type(numbers[3])
            is type(numbers[4]) is float and 0 <= min(numbers) and max(numbers) < _INF):
        for field_name, value in zip(_STATS_FIELDS[:5], numbers, strict=True):
            row[field_name] = _number(value, f"{name}: {field_name}")
    if _ADOPT_STATS:
        stats = _new(LatencyStats)
        _set(stats, "__dict__", row)
    else:
        stats = LatencyStats(**row)
    cand = _new(RankedCandidate)
    _set(cand, "__dict__", {"name": name, "stats": stats})
    return cand


def _parse_entry(item: Any, runs: list[dict[str, Any]]) -> CacheEntry:
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
    return _adopt(CacheEntry, item)


def entries_from_dict(data: Mapping[str, Any], *, source: str = "cache") -> list[CacheEntry]:
    """Parse a cache document; ``ValueError`` naming ``source`` and the bad entry.

    The entries adopt the document's dicts (it is consumed): pass a freshly parsed one.
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
    runs = data.get("runs", [])
    if type(runs) is not list or not all(type(r) is dict for r in runs):
        raise ValueError(f"{source}: 'runs' must be a list of objects")
    raw = data.get("entries")
    if type(raw) is not list:
        raise ValueError(f"{source}: 'entries' must be a list")
    entries = []
    with gc_paused():
        for i, item in enumerate(raw):
            try:
                entries.append(_parse_entry(item, runs))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{source}: entries[{i}] is invalid: {exc}") from None
    return entries
