"""The fleet-shared corpus: merging cache shards from many runners, and diffing two.

The merge rule (docs/artifacts.md): for one key, the entry measured against the newer
code and environment wins (the later ``since``: when the key was first measured
against its candidates' fingerprints and its environment), whatever its confidence;
between entries of the same ``since``, the one that timed more of the key's candidates;
then the higher confidence; then more samples behind the winner; then the winner's
lower relative spread; then the smaller canonical JSON.
That is a total order on entries, so :func:`merge` is commutative, associative and
idempotent, and the result never depends on which runner wrote last. Two clear picks
(confident, not a tie) of different winners for one key, measured against the same code
and environment with the same ``since``, each winner timed in the other's comparison, are
reported as a :class:`Conflict` (:func:`disagree`).
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pytest_arbiter.store.cache import CacheEntry, CacheKey, KeyTuple, MeasureCache, plain_key

Rank = tuple[datetime.datetime, int, float, int, float]

MERGE_RULE: tuple[str, ...] = (
    "the later since (measured against newer code or a newer environment)",
    "more of the key's candidates timed",
    "the higher confidence",
    "more samples behind the winner",
    "the winner's lower relative spread",
    "the smaller canonical JSON",
)
"""The merge rule's criteria in words, most important first: one per field of
:func:`rank`, then :func:`_pick`'s last resort. ``pytest-arbiter merge --help`` says
the rule from here."""

CONFLICT_RULE = ("two clear picks (confident, not a tie) of different winners for one "
                 "key, measured against the same code and environment with the same "
                 "since, each winner timed in the other's comparison")
"""What :func:`disagree` calls a conflict, in words (``merge --help``)."""


def rank(entry: CacheEntry) -> Rank:
    """What the merge rule compares, most important first (:data:`MERGE_RULE`):
    ``since`` (the newer code and environment), then the evidence: candidates timed,
    confidence, samples behind the winner, the winner's spread (lower is better)."""
    stats = entry.ranking[0].stats
    return (entry.since, entry.timed_count, entry.confidence, stats.samples, -stats.spread)


def prefer(a: CacheEntry, b: CacheEntry) -> CacheEntry:
    """The entry the merge rule keeps of two entries for the same key."""
    if a is b or a == b:
        return a
    return _pick_of(a, b)


def _pick(a: CacheEntry, b: CacheEntry, ra: Rank, rb: Rank) -> CacheEntry:
    """The merge rule on two different entries whose ranks are known: the higher rank,
    then the smaller canonical JSON."""
    if ra != rb:
        return a if ra > rb else b
    return a if a.canonical() <= b.canonical() else b


def _pick_of(a: CacheEntry, b: CacheEntry) -> CacheEntry:
    """``_pick(a, b, rank(a), rank(b))``, each field of :func:`rank` worked out only when
    the ones before it are equal (most pairs differ by ``since`` or the confidence: a
    merge of big shards meets hundreds of thousands)."""
    if a.since != b.since:
        return a if a.since > b.since else b
    timed_a, timed_b = a.timed_count, b.timed_count
    if timed_a != timed_b:
        return a if timed_a > timed_b else b
    if a.confidence != b.confidence:
        return a if a.confidence > b.confidence else b
    stats_a, stats_b = a.ranking[0].stats, b.ranking[0].stats
    if stats_a.samples != stats_b.samples:
        return a if stats_a.samples > stats_b.samples else b
    return _pick(a, b, rank(a), rank(b))


@dataclass(frozen=True)
class Conflict:
    """Clear picks of different winners for one key, of the same code, each winner timed
    in the other's comparison (:func:`disagree`): ``kept`` won by the merge rule."""

    key: CacheKey
    kept: CacheEntry
    other: CacheEntry

    def describe(self) -> str:
        return (f"conflict {'/'.join(self.key)}: kept {self.kept.winner} "
                f"({_evidence_text(self.kept)}) over {self.other.winner} "
                f"({_evidence_text(self.other)})")


def _evidence_text(entry: CacheEntry) -> str:
    host = entry.provenance.host or "?"
    return (f"host {host}, confidence {entry.confidence:.4g}, {entry.samples} samples, "
            f"spread {entry.spread * 100:.1f}%")


@dataclass
class MergeResult:
    """The merged entries by key, and the conflicts met on the way (sorted by key)."""

    entries: dict[KeyTuple, CacheEntry]
    conflicts: list[Conflict] = field(default_factory=list)

    def cache(self) -> MeasureCache:
        return MeasureCache(self.entries.values())


Part = MeasureCache | Iterable[CacheEntry] | Mapping[KeyTuple, CacheEntry]


def entries_of(part: Part) -> Iterable[CacheEntry]:
    if isinstance(part, Mapping):
        return part.values()
    return part


def merge(*parts: Part) -> MergeResult:
    """Merge caches (or iterables of entries) by the merge rule; O(total entries).

    A key only one part has is taken over in bulk (dict operations); only keys that
    several parts hold are compared, entry by entry.
    """
    merged: dict[KeyTuple, CacheEntry] = {}
    contested: dict[KeyTuple, list[CacheEntry]] = {}

    def meet(key: KeyTuple, held: CacheEntry, entry: CacheEntry) -> None:
        if held is entry or held == entry:
            return
        # every clear pick of a key met twice, so conflicts never depend on order
        seen = contested.get(key)
        if seen is None:
            seen = contested[key] = [held] if held.confident else []
        if entry.confident:
            seen.append(entry)
        merged[key] = _pick_of(held, entry)

    for part in parts:
        if isinstance(part, MeasureCache):
            # a cache holds each entry under its own key, once
            mine = part.by_key()
            common = mine.keys() & merged.keys()
            held_of = {key: merged[key] for key in common}
            merged.update(mine)
            for key in common:
                merged[key] = held_of[key]
                meet(key, held_of[key], mine[key])
            continue
        for entry in entries_of(part):
            key = plain_key(entry)
            held = merged.get(key)
            if held is None:
                merged[key] = entry
            else:
                meet(key, held, entry)
    conflicts: list[Conflict] = []
    for key, seen in contested.items():
        conflicts += _conflicts(key, merged[key], seen)
    conflicts.sort(key=lambda c: (c.key, c.other.winner))  # by key, then other winner
    return MergeResult(merged, conflicts)


def merge_key(key: KeyTuple, entries: Sequence[CacheEntry]
              ) -> tuple[CacheEntry, list[Conflict]]:
    """:func:`merge` of the entries of one key (in the parts' order): the entry kept,
    and the key's conflicts."""
    held = entries[0]
    seen: list[CacheEntry] | None = None
    for entry in entries[1:]:
        if held is entry or held == entry:
            continue
        if seen is None:
            seen = [held] if held.confident else []
        if entry.confident:
            seen.append(entry)
        held = _pick_of(held, entry)
    return held, [] if seen is None else _conflicts(key, held, seen)


def _conflicts(key: KeyTuple, kept: CacheEntry, seen: list[CacheEntry]) -> list[Conflict]:
    """The conflicts of ``kept`` with the clear picks met for its key (sorted by the
    other winner)."""
    if not seen or not kept.confident:
        return []
    others: dict[str, CacheEntry] = {}
    for entry in seen:
        if disagree(entry, kept):
            best = others.get(entry.winner)
            others[entry.winner] = entry if best is None else prefer(best, entry)
    return [Conflict(CacheKey._make(key), kept, others[w]) for w in sorted(others)]


def disagree(a: CacheEntry, b: CacheEntry) -> bool:
    """Whether two entries of one key are a conflict (:data:`CONFLICT_RULE`): clear
    picks of different winners, of the same code at the same ``since``, that both
    compared the two winners.

    Not a conflict: a winner measured against other code or another environment (what
    a change does), one a later measurement of the same code replaced (a recheck found
    the old winner slower: ``since`` moved on), and a winner the other entry did not
    time (unavailable or declining on its runner, or not considered there): that entry
    never compared the two, so nothing disagrees. Symmetric in ``a`` and ``b``.
    """
    return (a.confident and b.confident and a.winner != b.winner and a.since == b.since
            and a.same_basis(b) and timed_in(b, a.winner) and timed_in(a, b.winner))


def timed_in(entry: CacheEntry, name: str) -> bool:
    """Whether ``entry``'s comparison timed the candidate ``name``: its ``considered``
    row is ``timed`` (as the merge rule counts them, :attr:`CacheEntry.timed_count`); an
    entry without rows: its ranking names it."""
    if not entry.considered:
        return any(row.name == name for row in entry.ranking)
    row = entry.considered.get(name)
    return row is not None and row.outcome == "timed"


@dataclass(frozen=True)
class WinnerChange:
    """A key whose winner differs between two caches, and the medians behind both."""

    key: CacheKey
    old: CacheEntry
    new: CacheEntry

    @property
    def old_ns(self) -> float:
        """The old winner's median (in the old entry)."""
        return self.old.ranking[0].stats.median_ns

    @property
    def new_ns(self) -> float:
        """The new winner's median (in the new entry)."""
        return self.new.ranking[0].stats.median_ns

    @property
    def change(self) -> float:
        """Relative change of the winning median: -0.25 means the new pick is 25% faster."""
        return self.new_ns / self.old_ns - 1.0 if self.old_ns > 0 else 0.0

    @property
    def margin(self) -> float | None:
        """How much slower the old winner was in the new measurement (its paired ratio
        there, less one), if it was timed in it (a carried row was not)."""
        for cand in self.new.ranking:
            if cand.name == self.old.winner:
                ratio = self.new.over_winner(cand)
                return None if ratio is None else ratio - 1.0
        return None


@dataclass
class CacheDiff:
    """What changed from one cache to another: winners, added and removed keys."""

    changed: list[WinnerChange]
    added: list[CacheEntry]
    removed: list[CacheEntry]
    same: int


def _keyed(part: Part) -> Mapping[KeyTuple, CacheEntry]:
    """The entries of ``part`` by key; a cache's own keys (no new key tuple per entry: a
    million of them are a tenth of a loaded corpus's memory)."""
    if isinstance(part, MeasureCache):
        return part.by_key()
    if isinstance(part, Mapping):
        return part
    return {plain_key(e): e for e in part}


def diff(old: Part, new: Part) -> CacheDiff:
    """Winners that changed between ``old`` and ``new``, plus keys only one of them has."""
    before, after = _keyed(old), _keyed(new)
    changed: list[WinnerChange] = []
    added: list[CacheEntry] = []
    removed: list[CacheEntry] = []
    same = 0
    for change in diff_sorted(map(before.__getitem__, sorted(before)),
                              map(after.__getitem__, sorted(after))):
        if change is None:
            same += 1
        elif isinstance(change, WinnerChange):
            changed.append(change)
        else:
            (added if change.old is None else removed).append(change.entry)
    return CacheDiff(changed, added, removed, same)


class KeyChange(NamedTuple):
    """A key only one of two caches has: ``old`` or ``new`` is ``None``."""

    old: CacheEntry | None
    new: CacheEntry | None

    @property
    def entry(self) -> CacheEntry:
        """The entry of the cache that has the key."""
        found = self.new if self.old is None else self.old
        assert found is not None
        return found


_NO_KEY: KeyTuple = ("", "", "", "", "")


def _key_of(entry: CacheEntry | None) -> KeyTuple:
    return _NO_KEY if entry is None else plain_key(entry)


def diff_sorted(old: Iterable[CacheEntry], new: Iterable[CacheEntry]
                ) -> Iterator[WinnerChange | KeyChange | None]:
    """What :func:`diff` finds, key by key in key order, of two caches' entries each
    sorted by key, one per key: a :class:`WinnerChange`, a :class:`KeyChange` (added or
    removed), or ``None`` (the same winner)."""
    olds, news = iter(old), iter(new)
    a, b = next(olds, None), next(news, None)
    ka, kb = _key_of(a), _key_of(b)
    while a is not None and b is not None:
        if ka == kb:
            yield None if a.winner == b.winner else WinnerChange(CacheKey._make(kb), a, b)
            a, b = next(olds, None), next(news, None)
            ka, kb = _key_of(a), _key_of(b)
        elif ka < kb:
            yield KeyChange(a, None)
            a = next(olds, None)
            ka = _key_of(a)
        else:
            yield KeyChange(None, b)
            b = next(news, None)
            kb = _key_of(b)
    for rest in () if a is None else itertools.chain([a], olds):
        yield KeyChange(rest, None)
    for rest in () if b is None else itertools.chain([b], news):
        yield KeyChange(None, rest)


@dataclass(frozen=True)
class ForgetFilter:
    """The entries ``pytest-arbiter forget`` removes: those that every filter given
    (not ``None``) picks.

    ``device`` picks an entry of that device tag, or of that target (``cpu``: every CPU
    device's, as ``show --device`` picks); ``candidate`` one whose ranking, rejected or
    considered candidates name it; ``measured_before`` one whose
    ``provenance.measured_at`` is earlier (an entry without a readable ``measured_at`` is
    of unknown age, and never picked by it).
    """

    device: str | None = None
    op: str | None = None
    candidate: str | None = None
    measured_before: datetime.datetime | None = None
    _times: dict[str, datetime.datetime | None] = field(
        default_factory=dict, compare=False, repr=False)

    @property
    def empty(self) -> bool:
        """No filter given: it would pick every entry."""
        return (self.device is None and self.op is None and self.candidate is None
                and self.measured_before is None)

    def measured_at(self, entry: CacheEntry) -> datetime.datetime | None:
        """When the entry was measured, in UTC; ``None`` if it does not say (readably)."""
        text = entry.provenance.measured_at
        if not isinstance(text, str):
            return None
        if text not in self._times:  # a tuning run's entries share a few
            self._times[text] = _utc_time(text)
        return self._times[text]

    def picks(self, entry: CacheEntry) -> bool:
        if self.device is not None and self.device not in (entry.device, entry.target):
            return False
        if self.op is not None and entry.op != self.op:
            return False
        name = self.candidate
        if name is not None and not (name in entry.considered or name in entry.rejected
                                     or any(r.name == name for r in entry.ranking)):
            return False
        if self.measured_before is not None:
            when = self.measured_at(entry)
            return when is not None and when < self.measured_before
        return True


def _utc_time(text: str) -> datetime.datetime | None:
    """An RFC 3339 time (``2026-12-03T06:23:11Z``) in UTC; ``None`` if it is not one
    (a naive time counts as UTC)."""
    import msgspec

    try:
        when = msgspec.convert(text, datetime.datetime)
    except msgspec.ValidationError:
        return None
    return (when.replace(tzinfo=datetime.timezone.utc) if when.tzinfo is None
            else when.astimezone(datetime.timezone.utc))


def cache_of(entries: list[CacheEntry]) -> MeasureCache:
    """A cache of ``entries``; a key listed twice (a hand-resolved git conflict) keeps
    the entry the merge rule prefers."""
    by_key = dict(zip(map(plain_key, entries), entries, strict=True))
    if len(by_key) != len(entries):
        return merge(entries).cache()
    return MeasureCache.of_keyed(by_key)
