"""The degrade gate: compare a run's histogram with the committed baseline."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import and_, eq, itemgetter, lt, not_

from pytest_arbiter.gating.histogram import GATED_OUTCOMES, STALE, HistogramKey, named_keys
from pytest_arbiter.store.safetext import counted


def failing_outcomes(*, stale: bool) -> tuple[str, ...]:
    """The outcomes that fail a run, or a fleet's reports, unless the baseline lists them:
    the gated ones, and ``stale`` when rechecks gate too (``--arbiter-recheck=fail``,
    ``pytest-arbiter gate --stale=fail``). The one rule the plugin and the CLI share."""
    return GATED_OUTCOMES + ((STALE,) if stale else ())


@dataclass(frozen=True)
class BaselineVerdict:
    """New failing entries (not in the baseline), known ones, and fixed ones."""

    new: dict[HistogramKey, int]
    known: dict[HistogramKey, int]
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


def compare_to_baseline(run: Mapping[HistogramKey, int], baseline: Mapping[HistogramKey, int],
                        *, failing: tuple[str, ...] = GATED_OUTCOMES) -> BaselineVerdict:
    """A ``failing`` entry of ``run`` fails unless ``baseline`` lists the same key.

    Baseline keys whose outcome is failing but that ``run`` no longer has are "fixed".
    """
    run, baseline = _named(run), _named(baseline)
    # each step one C loop over up to a million keys, not a Python one
    keys, counts = _failing(run, failing)
    listed = list(map(baseline.__contains__, keys))
    unlisted = list(map(not_, listed))
    new = dict(zip(compress(keys, unlisted), compress(counts, unlisted), strict=True))
    known = dict(zip(compress(keys, listed), compress(counts, listed), strict=True))
    once = _failing(baseline, failing)[0]
    fixed = sorted(compress(once, map(eq, map(run.get, once, repeat(0)), repeat(0))))
    return BaselineVerdict(new, known, fixed)


def _failing(counts: Mapping[HistogramKey, int], failing: tuple[str, ...]
             ) -> tuple[list[HistogramKey], list[int]]:
    """The keys of ``counts``, in its order, whose outcome is ``failing`` and whose
    count is positive, and their counts."""
    outcome_fails = map(frozenset(failing).__contains__, map(_OUTCOME, counts))
    chosen = list(map(and_, outcome_fails, map(lt, repeat(0), counts.values())))
    return list(compress(counts, chosen)), list(compress(counts.values(), chosen))


def _named(counts: Mapping[HistogramKey, int]) -> Mapping[HistogramKey, int]:
    """``counts`` itself when its keys are all :class:`HistogramKey` (read from a file,
    only read here: no copy of a million keys), else :func:`named_keys`."""
    if type(counts) is dict and set(map(type, counts)) <= {HistogramKey}:
        return counts
    return named_keys(counts)


_OUTCOME = itemgetter(3)
_TARGET_OP = itemgetter(0, 1)


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


def gate_fleet(run: Mapping[HistogramKey, int], baseline: Mapping[HistogramKey, int],
               *, failing: tuple[str, ...] = GATED_OUTCOMES,
               evidence: Evidence | None = None,
               dispatched: Mapping[HistogramKey, int] | None = None) -> FleetVerdict:
    """:func:`compare_to_baseline`, with fixed entries split from unchecked ones: an
    entry is fixed only where the run dispatched its target and op (``dispatched``: every
    count, the on-purpose degrades' too, which ``run`` leaves out; ``run`` when not
    given). With ``evidence`` (the run itself, or JUnit reports that carry it), an entry
    is fixed only when the evidence proves it (:meth:`Evidence.proves_fixed`)."""
    verdict = compare_to_baseline(run, baseline, failing=failing)
    covered: set[tuple[str, str]] = set()
    if verdict.fixed:
        seen = _named(run if dispatched is None else dispatched)
        covered.update(map(_TARGET_OP, compress(seen, map(lt, repeat(0), seen.values()))))
    # a stale entry that a run does not show was maybe never rechecked (no
    # --arbiter-recheck, the budget spent, not dispatched from the cache): unchecked
    fixed = [k for k in verdict.fixed if (k.target, k.op) in covered and k.outcome != STALE
             and (evidence is None or evidence.proves_fixed(k))]
    proven = set(fixed)  # a list's `in` would make this quadratic
    unchecked = [k for k in verdict.fixed if k not in proven]
    return FleetVerdict(BaselineVerdict(verdict.new, verdict.known, fixed), unchecked)


def tightened(baseline: Mapping[HistogramKey, int], fixed: list[HistogramKey]
              ) -> dict[HistogramKey, int]:
    """The baseline without its ``fixed`` entries: a fixed degrade may not come back."""
    drop = set(fixed)
    return {k: v for k, v in baseline.items() if k not in drop}
