"""The dispatch histogram: outcome counts per (target, op, selected candidate).

Memory is bounded by the number of distinct keys: each dispatch bumps a counter. The
file format (typed, validated) is :mod:`pytest_arbiter.gating.histogram_file`.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final, Literal, NamedTuple, cast

Outcome = Literal["won", "degraded", "no_candidate", "error", "rejected", "stale"]
"""What one dispatch record means (docs/contract.md, "Outcomes"): :data:`OUTCOMES` as a
type (a test keeps the two equal)."""
OUTCOMES: tuple[Outcome, ...] = ("won", "degraded", "no_candidate", "error", "rejected",
                                 "stale")
GATED_OUTCOMES: tuple[Outcome, ...] = ("degraded", "rejected", "error")
"""Outcomes the CI gate fails on unless the baseline lists them."""
STALE = "stale"
"""A cached winner a recheck found slower than another candidate, timed side by side
(``--arbiter-recheck``): gated like the above only with ``--arbiter-recheck=fail``
(``pytest-arbiter gate --stale=fail``)."""
NO_CANDIDATE = "none"
HISTOGRAM_SCHEMA: Final = "pytest-arbiter/histogram"
HISTOGRAM_VERSION: Final = 1
REFERENCE = "the reference"
"""Who ran a dispatch no candidate could run (in a reason, an explain line)."""

class HistogramKey(NamedTuple):
    """One counter of the histogram. A plain 4-tuple in this order finds the same count."""

    target: str
    op: str
    selected: str
    """The candidate's name; ``"none"`` for ``no_candidate``."""
    outcome: Outcome


AnyCounts = Mapping[HistogramKey, int] | Mapping[tuple[str, str, str, str], int]
"""Counts named_keys by :class:`HistogramKey` or by plain tuples in its order."""


def named_keys(counts: AnyCounts) -> dict[HistogramKey, int]:
    """``counts`` with each key a :class:`HistogramKey` (a caller may pass plain tuples),
    a new dict in the same order."""
    if set(map(type, counts)) <= {HistogramKey}:  # as read from a file: one C pass, a copy
        return dict(cast("Mapping[HistogramKey, int]", counts))
    return {k if type(k) is HistogramKey else HistogramKey._make(k): v
            for k, v in counts.items()}


def as_keys(rows: Iterable[tuple[str, str, str, str]]) -> Iterator[HistogramKey]:
    """Each 4-tuple of ``rows`` as a :class:`HistogramKey`, made in C (what ``_make``
    does, without a Python call each): for a million rows read from a file."""
    return map(tuple.__new__, itertools.repeat(HistogramKey), rows)


FindingKey = tuple[str, str, str, str, str, Outcome]
"""(target, op, bucket, dtype, candidate, outcome): a failing kernel that a measurement
or a replay of the corpus found for one dispatch key (docs/contract.md, "Counting")."""


def finding_counts(findings: Iterable[FindingKey]) -> dict[HistogramKey, int]:
    """How many findings count under each histogram entry."""
    out: dict[HistogramKey, int] = {}
    for found in findings:
        key = HistogramKey(found[0], found[1], found[4], found[5])
        out[key] = out.get(key, 0) + 1
    return out


class Reasons:
    """One reason per entry: the first seen, unless a later one is more severe. The
    severity is a silent fallback's measured slowdown (one entry may fall back on many
    keys, by 1.1x on one and 10x on another: the worst is the one to read), 0 for
    reasons without a measure."""

    def __init__(self) -> None:
        self.text: dict[HistogramKey, str] = {}
        self.severity: dict[HistogramKey, float] = {}

    def keep(self, key: HistogramKey, reason: str, severity: float = 0.0) -> None:
        """Keep ``reason`` for ``key`` if it is the first, or more severe than the kept
        one."""
        if key not in self.text or severity > self.severity[key]:
            self.text[key] = reason
            self.severity[key] = severity

    def take(self, other: Reasons) -> None:
        """:meth:`keep` each of ``other``'s reasons."""
        for key, reason in other.text.items():
            self.keep(key, reason, other.severity[key])


class DispatchHistogram:
    """Thread-safe outcome counters, convertible to and from plain JSON-able dicts.

    Each key owns an ``itertools.count``: ``next()`` on it is one C call that the GIL
    makes atomic, so the dispatch hot path bumps a counter without taking a lock.
    """

    def __init__(self, counts: AnyCounts | None = None) -> None:
        self._counters: dict[HistogramKey, itertools.count[int]] = {}
        self._base: dict[HistogramKey, int] = {}
        self._extra: dict[HistogramKey, int] = {}
        self._lock = threading.Lock()
        for key, count in (counts or {}).items():
            self.add(key, count)

    def counter(self, key: tuple[str, str, str, str]) -> Callable[[], int]:
        """The bound ``next`` of ``key``'s counter: call it to count one dispatch."""
        # a plain tuple finds its HistogramKey: equal tuples, equal hashes
        found = cast("dict[tuple[str, str, str, str], itertools.count[int]]",
                     self._counters).get(key)
        if found is None:
            named = key if type(key) is HistogramKey else HistogramKey._make(key)
            with self._lock:
                found = self._counters.setdefault(named, itertools.count())
        return found.__next__

    def add(self, key: tuple[str, str, str, str], count: int = 1) -> None:
        """Count ``key`` ``count`` times (already validated)."""
        if count == 1:
            self.counter(key)()
            return
        named = key if type(key) is HistogramKey else HistogramKey._make(key)
        self.counter(named)
        with self._lock:
            self._extra[named] = self._extra.get(named, 0) + count

    def _value(self, key: HistogramKey) -> int:
        # repr(count(n)) is "count(n)": n values were handed out
        handed_out = int(repr(self._counters[key])[6:-1])
        return handed_out + self._extra.get(key, 0) - self._base.get(key, 0)

    def record(self, target: str, op: str, selected: str, outcome: Outcome, count: int = 1) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; outcomes are {', '.join(OUTCOMES)}")
        self.add(HistogramKey(target, op, selected, outcome), count)

    def counts(self, target: str | None = None, op: str | None = None) -> dict[HistogramKey, int]:
        """Counts per (target, op, selected, outcome), optionally for one target and/or op."""
        with self._lock:
            items = [(k, self._value(k)) for k in list(self._counters)]
        return {k: v for k, v in items if v > 0
                and (target is None or k.target == target) and (op is None or k.op == op)}

    def total(self, outcome: str | None = None) -> int:
        return sum(v for k, v in self.counts().items() if outcome is None or k.outcome == outcome)

    def __len__(self) -> int:
        return len(self.counts())

    def discount(self, counts: Mapping[HistogramKey, int]) -> None:
        """Take ``counts`` back (a retried test's earlier attempt); counters handed to
        hot paths keep working."""
        with self._lock:
            for key, count in counts.items():
                if key in self._counters:
                    self._base[key] = self._base.get(key, 0) + min(count, self._value(key))

    def clear(self) -> None:
        """Zero every count; counters handed to hot paths keep working."""
        with self._lock:
            for key in self._counters:
                self._base[key] = self._base.get(key, 0) + self._value(key)

    def merge(self, other: DispatchHistogram | AnyCounts) -> None:
        items = other.counts() if isinstance(other, DispatchHistogram) else named_keys(other)
        for key, count in items.items():
            self.add(key, count)

    def minus(self, before: Mapping[HistogramKey, int]) -> dict[HistogramKey, int]:
        """Counts added since the snapshot ``before`` (what one test dispatched)."""
        now = self.counts()
        return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0) > 0}


def merge_counts(parts: Iterable[Mapping[HistogramKey, int]]) -> dict[HistogramKey, int]:
    total: dict[HistogramKey, int] = {}
    for part in parts:
        for key, count in part.items():
            total[key] = total.get(key, 0) + count
    return total
