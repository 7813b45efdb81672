"""The degrade gate: compare a run's histogram with the committed baseline."""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import and_, lt, not_, truth

from pytest_arbiter.gating.histogram import (
    GATED_OUTCOMES,
    SEP,
    STALE,
    AnyCounts,
    CountColumns,
    HistogramKey,
    join_keys,
    positive,
    split_keys,
)
from pytest_arbiter.store.safetext import counted

GATE_REMEDY = ("fix the kernel, mark the test arbiter_expect_degrade, or add them to the "
               "baseline")
"""What to do about a new degraded, rejected or error entry: the words of the run's
summary, ``pytest-arbiter gate`` and the report page alike."""


def failing_outcomes(*, stale: bool) -> tuple[str, ...]:
    """The outcomes that fail a run, or a fleet's reports, unless the baseline lists them:
    the gated ones, and ``stale`` when rechecks gate too (``--arbiter-recheck=fail``,
    ``pytest-arbiter gate --stale=fail``). The one rule the plugin and the CLI share."""
    return GATED_OUTCOMES + ((STALE,) if stale else ())


@dataclass(frozen=True)
class BaselineVerdict:
    """New failing entries (not in the baseline), known ones, and fixed ones."""

    new: dict[HistogramKey, int]
    known: Mapping[HistogramKey, int]
    """In the run's order; :class:`CountColumns` (the keys made when asked for)."""
    fixed: list[HistogramKey]

    @property
    def passed(self) -> bool:
        return not self.new

    def describe_new(self) -> list[str]:
        return [f"new {k.outcome}: target={k.target} op={k.op} candidate={k.selected} "
                f"({counted(v, 'dispatch', 'dispatches')})"
                for k, v in sorted(self.new.items())]

    def describe_fixed(self) -> list[str]:
        return [f"fixed {k.outcome}: target={k.target} op={k.op} candidate={k.selected} "
                "(no longer seen; tighten the baseline)" for k in self.fixed]


def compare_to_baseline(run: AnyCounts, baseline: AnyCounts,
                        *, failing: tuple[str, ...] = GATED_OUTCOMES) -> BaselineVerdict:
    """A ``failing`` entry of ``run`` fails unless ``baseline`` lists the same key.

    Baseline keys whose outcome is failing but that ``run`` no longer has are "fixed".
    """
    listed = CountColumns.of(baseline)
    new, known, fixed = _compare(CountColumns.of(run), listed, failing)
    return BaselineVerdict(new, known, list(split_keys(fixed, listed.escaped)))


def _compare(run: CountColumns, baseline: CountColumns, failing: tuple[str, ...]
             ) -> tuple[dict[HistogramKey, int], CountColumns, list[str]]:
    """The new entries, the known ones (in ``run``'s order) and the fixed ones (their
    strings, in key order): each step one C loop over up to a million keys."""
    ends = tuple(SEP + outcome for outcome in failing)
    fails = list(map(str.endswith, run.joined, repeat(ends)))
    # of the run's failing keys, those seen (a count not zero: a mapping's may be
    # negative) and, of those, the positive ones
    seen_keys = list(compress(run.joined, map(and_, fails, map(truth, run.counts))))
    keys, counts = _failing(run, ends, fails)
    listed = list(map(baseline.key_set().__contains__, keys))
    unlisted = list(map(not_, listed))
    new = dict(zip(split_keys(compress(keys, unlisted), run.escaped),
                   compress(counts, unlisted), strict=True))
    known = run.like(list(compress(keys, listed)), list(compress(counts, listed)))
    once = _failing(baseline, ends)[0]
    seen = frozenset(seen_keys)
    fixed = sorted(compress(once, map(not_, map(seen.__contains__, once))))
    return new, known, fixed


def _failing(columns: CountColumns, ends: tuple[str, ...], fails: list[bool] | None = None
             ) -> tuple[list[str], list[int]]:
    """The keys of ``columns``, in its order, whose outcome is failing (their strings
    end with one of ``ends``: ``fails``, when known) and whose count is positive, and
    their counts."""
    if fails is None:
        fails = list(map(str.endswith, columns.joined, repeat(ends)))
    if min(columns.counts, default=1) > 0:
        chosen = fails
    else:
        chosen = list(map(and_, fails, map(lt, repeat(0), columns.counts)))
    return list(compress(columns.joined, chosen)), list(compress(columns.counts, chosen))


def first_keys(keys: Iterable[HistogramKey], n: int | None) -> list[HistogramKey]:
    """The first ``n`` of ``keys`` in key order (all, sorted, when ``n`` is None): of
    :class:`CountColumns`, without making a key of each."""
    if isinstance(keys, CountColumns):
        return keys.smallest(n)
    return sorted(keys) if n is None else heapq.nsmallest(n, keys)


@dataclass(frozen=True)
class FleetVerdict:
    """The gate over many runners' reports.

    A baseline entry the reports no longer show is ``fixed`` only when some report
    dispatched its (target, op) at all; otherwise it is ``unchecked`` (no runner of
    that target reported, e.g. the GPU jobs did not run) and stays in the baseline. A
    ``stale`` entry is never fixed this way: its absence may only mean no recheck ran.
    """

    verdict: BaselineVerdict
    unchecked: list[HistogramKey]

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    @property
    def fixed(self) -> list[HistogramKey]:
        return self.verdict.fixed


Triple = tuple[str, str, str]
"""(target, op, candidate)."""


@dataclass(frozen=True)
class Evidence:
    """What a run saw of its candidates, for telling a fixed entry from an unchecked
    one: ``checked``, candidates that passed the F4 gate or ran a dispatch and never
    failed; ``registered``, the candidates registered for each (target, op) the run
    dispatched. An entry of a candidate that is neither checked nor gone (unavailable
    on this runner, or not reached by a ``-k`` subset) proves nothing."""

    checked: frozenset[Triple] = frozenset()
    registered: frozenset[Triple] = frozenset()
    ops: frozenset[tuple[str, str]] = field(default=frozenset())

    @classmethod
    def of(cls, checked: Iterable[Triple], failed: Iterable[Triple],
           registered: Iterable[Triple]) -> Evidence:
        known = frozenset(registered)
        return cls(frozenset(checked) - frozenset(failed), known,
                   frozenset((t, o) for t, o, _ in known))

    def proves_fixed(self, key: HistogramKey) -> bool:
        """The entry's candidate was checked and passed, or is gone from its op."""
        triple = (key.target, key.op, key.selected)
        gone = (key.target, key.op) in self.ops and triple not in self.registered
        return triple in self.checked or gone


def gate_fleet(run: AnyCounts, baseline: AnyCounts,
               *, failing: tuple[str, ...] = GATED_OUTCOMES,
               evidence: Evidence | None = None,
               dispatched: AnyCounts | None = None) -> FleetVerdict:
    """:func:`compare_to_baseline`, with fixed entries split from unchecked ones: an
    entry is fixed only where the run dispatched its target and op (``dispatched``: every
    count, the on-purpose degrades' too, which ``run`` leaves out; ``run`` when not
    given). With ``evidence`` (the run itself, or JUnit reports that carry it), an entry
    is fixed only when the evidence proves it (:meth:`Evidence.proves_fixed`)."""
    run_columns, listed = CountColumns.of(run), CountColumns.of(baseline)
    new, known, once = _compare(run_columns, listed, failing)
    # a stale entry that a run does not show was maybe never rechecked (no
    # --arbiter-recheck, the budget spent, not dispatched from the cache): unchecked
    seen = run_columns if dispatched is None else CountColumns.of(dispatched)
    fresh = map(not_, map(str.endswith, once, repeat(SEP + STALE)))
    maybe = list(compress(once, map(and_, _covered(seen, once), fresh)))
    fixed = list(split_keys(maybe, listed.escaped))
    if evidence is not None:
        fixed = list(compress(fixed, map(evidence.proves_fixed, fixed)))
    proven = frozenset(join_keys(fixed)[0])
    unchecked = split_keys(compress(once, map(not_, map(proven.__contains__, once))),
                           listed.escaped)
    return FleetVerdict(BaselineVerdict(new, known, fixed), list(unchecked))


def dispatched(seen: AnyCounts, keys: Sequence[HistogramKey]) -> list[bool]:
    """Whether the reports dispatched each key's target and op at all (an unchecked
    entry of one they did: its candidate was not checked there, unavailable or not
    reached)."""
    return _covered(CountColumns.of(seen), join_keys(keys)[0])


def _covered(seen: CountColumns, keys: list[str]) -> list[bool]:
    """Whether ``seen`` has a positive count of each key's target and op: a binary
    search, in C, of each key's ``target SEP op SEP`` among the keys in order."""
    if not keys:
        return []
    counted = positive(seen)
    ordered = counted.joined if counted.ascending() else sorted(counted.joined)
    # from the left: a name escaped to start with NUL U+0001 puts a NUL pair right after
    # its separator, which a split from the right would take for the separator
    heads = map(str.split, keys, repeat(SEP), repeat(2))
    prefixes = [f"{head[0]}{SEP}{head[1]}{SEP}" for head in heads]
    at = map(bisect_left, repeat(ordered), prefixes)
    return list(map(str.startswith, map([*ordered, ""].__getitem__, at), prefixes))


def tightened(baseline: Mapping[HistogramKey, int], fixed: list[HistogramKey]
              ) -> dict[HistogramKey, int]:
    """The baseline without its ``fixed`` entries: a fixed degrade may not come back."""
    drop = set(fixed)
    return {k: v for k, v in baseline.items() if k not in drop}
