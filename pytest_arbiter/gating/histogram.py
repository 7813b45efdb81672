"""The dispatch histogram: outcome counts per (target, op, selected candidate).

Memory is bounded by the number of distinct keys: each dispatch bumps a counter. The
file format (typed, validated) is :mod:`pytest_arbiter.gating.histogram_file`.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from bisect import bisect_left
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping, Sequence
from itertools import compress, islice, repeat
from operator import lt
from typing import Any, Final, Literal, NamedTuple, cast

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


SEP: Final = "\0\0"
"""What joins a key's four names into one string (:func:`join_keys`); a NUL in a name is
written NUL U+0001, so no name holds ``SEP`` and the strings sort as the keys do."""
_NUL, _NUL_WRITTEN = "\0", "\0\1"


def join_keys(rows: Sequence[Any], fields: Callable[[Any], tuple[str, str, str, str]]
              | None = None, *, plain: bool = False) -> tuple[list[str], bool]:
    """Each key of ``rows`` (``fields`` of each row, else the row) as one string, and
    whether a name held a NUL (written NUL U+0001). ``plain`` promises that none does
    (a JSON file without a backslash). C loops: a million keys in about 0.15 s."""
    tuples = rows if fields is None else map(fields, rows)
    keys = list(map(SEP.join, tuples))
    if plain or "".join(keys).count(_NUL) == 6 * len(keys):
        return keys, False
    tuples = rows if fields is None else map(fields, rows)
    return [SEP.join([name.replace(_NUL, _NUL_WRITTEN) for name in row])
            for row in tuples], True


def split_keys(keys: Iterable[str], escaped: bool = False) -> Iterator[HistogramKey]:
    """The :class:`HistogramKey` of each string of :func:`join_keys`."""
    rows: Iterable[Sequence[str]] = map(str.split, keys, repeat(SEP))
    if escaped:
        rows = ([name.replace(_NUL_WRITTEN, _NUL) for name in row] for row in rows)
    return as_keys(cast("Iterable[tuple[str, str, str, str]]", rows))


class CountColumns(Mapping[HistogramKey, int]):
    """Counts a column each, for a gate over a million keys: the keys as strings of
    :func:`join_keys` (no key twice), their counts in the same order. Read as a mapping,
    each key is a :class:`HistogramKey` made when asked for; the gate works on the
    columns in C loops and makes keys only for the lines it prints."""

    __slots__ = ("_ascending", "_index", "_set", "counts", "escaped", "joined")

    def __init__(self, keys: list[str], counts: list[int], escaped: bool = False) -> None:
        self.joined, self.counts, self.escaped = keys, counts, escaped
        self._set: frozenset[str] | None = None
        self._index: dict[str, int] | None = None
        self._ascending: bool | None = None

    @classmethod
    def of(cls, counts: AnyCounts) -> CountColumns:
        """``counts`` itself if columns, else its keys (:class:`HistogramKey` or plain
        tuples) joined, in its order."""
        if isinstance(counts, CountColumns):
            return counts
        keys, escaped = join_keys(list(counts))
        return cls(keys, list(counts.values()), escaped)

    def like(self, keys: list[str], counts: list[int]) -> CountColumns:
        """Columns of some of these keys, in their order (so in key order if these are)."""
        out = CountColumns(keys, counts, self.escaped)
        if self._ascending:
            out._ascending = True
        return out

    def key_set(self) -> frozenset[str]:
        if self._set is None:
            self._set = frozenset(self.joined)
        return self._set

    def ascending(self) -> bool:
        """Whether the keys are in key order (as a file this package writes holds them)."""
        if self._ascending is None:
            self._ascending = all(map(lt, self.joined, islice(self.joined, 1, None)))
        return self._ascending

    def smallest(self, n: int | None) -> list[HistogramKey]:
        """The first ``n`` keys in key order; all of them, sorted, when ``n`` is None."""
        if n is None:
            chosen = self.joined if self.ascending() else sorted(self.joined)
        else:
            chosen = self.joined[:n] if self.ascending() else heapq.nsmallest(n, self.joined)
        return list(split_keys(chosen, self.escaped))

    def to_dict(self) -> dict[HistogramKey, int]:
        return dict(zip(split_keys(self.joined, self.escaped), self.counts, strict=True))

    def __len__(self) -> int:
        return len(self.joined)

    def __iter__(self) -> Iterator[HistogramKey]:
        return split_keys(self.joined, self.escaped)

    def __getitem__(self, key: object) -> int:
        if not isinstance(key, tuple) or len(key) != 4:
            raise KeyError(key)
        joined = join_keys([key])[0][0]
        if self.ascending():  # a binary search: a few lookups build no index
            at = bisect_left(self.joined, joined)
            if at < len(self.joined) and self.joined[at] == joined:
                return self.counts[at]
            raise KeyError(key)
        if self._index is None:
            self._index = dict(zip(self.joined, range(len(self.joined)), strict=True))
        return self.counts[self._index[joined]]

    def items(self) -> ItemsView[HistogramKey, int]:
        return _Items(self)


class _Items(ItemsView[HistogramKey, int]):
    """A :class:`CountColumns`'s items made in C loops, not a lookup each."""

    _mapping: CountColumns

    def __iter__(self) -> Iterator[tuple[HistogramKey, int]]:
        columns = self._mapping
        return zip(split_keys(columns.joined, columns.escaped), columns.counts, strict=True)


def positive(columns: CountColumns) -> CountColumns:
    """The keys of ``columns`` whose count is above zero."""
    if min(columns.counts, default=1) > 0:
        return columns
    keep = list(map(lt, repeat(0), columns.counts))
    return columns.like(list(compress(columns.joined, keep)),
                        list(compress(columns.counts, keep)))


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
