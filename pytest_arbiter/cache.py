"""The MeasureCache: measured winners keyed by (device, target, op, bucket, dtype)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_arbiter.measure import LatencyStats

CACHE_SCHEMA = "pytest-arbiter/cache"
CACHE_VERSION = 1

CacheKey = tuple[str, str, str, str, str]
"""(device, target, op, bucket, dtype)."""


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device, "target": self.target, "op": self.op,
            "bucket": self.bucket, "dtype": self.dtype, "winner": self.winner,
            "ranking": [r.to_dict() for r in self.ranking],
            "confidence": self.confidence, "tie": self.tie,
            "rejected": dict(sorted(self.rejected.items())),
            "provenance": dict(sorted(self.provenance.items())),
        }

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
        with self._lock:
            return [self._entries[k] for k in sorted(self._entries)]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def to_dict(self) -> dict[str, Any]:
        return {"schema": CACHE_SCHEMA, "version": CACHE_VERSION,
                "entries": [e.to_dict() for e in self.entries()]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "cache") -> MeasureCache:
        return cls(entries_from_dict(data, source=source))


def entries_from_dict(data: Mapping[str, Any], *, source: str = "cache") -> list[CacheEntry]:
    """Parse a cache dict; ``ValueError`` naming ``source`` and the bad entry."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != CACHE_SCHEMA:
        raise ValueError(f"{source}: schema is {data.get('schema')!r}, expected {CACHE_SCHEMA!r}")
    version = data.get("version")
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"{source}: cache version {version!r} is not a positive integer")
    if version > CACHE_VERSION:
        raise ValueError(f"{source}: cache schema version {version} is newer than version "
                         f"{CACHE_VERSION}, the newest this pytest-arbiter reads; upgrade it")
    raw = data.get("entries")
    if not isinstance(raw, list):
        raise ValueError(f"{source}: 'entries' must be a list")
    entries = []
    for i, item in enumerate(raw):
        try:
            entries.append(CacheEntry.from_dict(item))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: entries[{i}] is invalid: {exc!r}") from None
    return entries
