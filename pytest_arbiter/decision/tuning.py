"""Measured arbitration: gate the candidates, time the survivors side by side, record
the entry (measure-at-first-miss).

One pipeline of short steps over one :class:`Measurement`: start (screen the pool, read
the cached entry), a cache hit times nothing, choose what to time, gate it, time the
survivors, build the entry. What to time is one rule: with no usable entry, every
candidate that can run the inputs; otherwise the cached leader, the runner-up and every
new or changed candidate that can run them. The entry's ranking follows
:func:`pytest_arbiter.decision.entry.ranked_rows`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.gate import GATE_SEED, GateReport
from pytest_arbiter.core.ops import OPS, Op
from pytest_arbiter.core.regions import Region
from pytest_arbiter.decision.entry import considered_rows, provenance, ranked_rows
from pytest_arbiter.decision.freshness import Freshness, freshness
from pytest_arbiter.decision.gating import SharedTrials, Verdict, f4_gate, verdict_of
from pytest_arbiter.decision.screen import Notes, accepting, by_rank, screen
from pytest_arbiter.decision.selection import Selection
from pytest_arbiter.decision.states import exc_text
from pytest_arbiter.decision.timers import timer_for
from pytest_arbiter.errors import Decline
from pytest_arbiter.extend import hooks
from pytest_arbiter.extend.backends import DeviceInfo
from pytest_arbiter.extend.device import lock_identity, probe_device
from pytest_arbiter.extend.fingerprint import current_environment
from pytest_arbiter.gating.histogram import Outcome
from pytest_arbiter.store.cache import CacheEntry, CacheKey, MeasureCache, since_for, utc_now
from pytest_arbiter.timing.device_lock import measurement_lock
from pytest_arbiter.timing.measure import ComparePolicy, Comparison, Timer, compare_latencies

VerdictFn = Callable[[Candidate], Verdict]
"""A candidate's gate verdict for the measured key (the arbiter passes its memo)."""


@dataclass
class Measurement:
    """One key's measurement as it goes through the pipeline."""

    op: Op
    inputs: Sequence[Any]
    region: Region
    device: DeviceInfo
    key: CacheKey
    entry: CacheEntry | None
    pool: list[Candidate]
    applicable: list[Candidate]
    usable: list[Candidate]
    notes: Notes
    environment: dict[str, str]
    now: Freshness | None = None
    weak: bool = False
    """The entry is measured again for its evidence (it was low-confidence)."""
    gated: list[Candidate] = field(default_factory=list)
    survivors: list[Candidate] = field(default_factory=list)
    declined_these: list[Candidate] = field(default_factory=list)
    gate_declined: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    found: dict[str, tuple[Outcome, str]] = field(default_factory=dict)
    reports: dict[str, GateReport] = field(default_factory=dict)
    trials: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The patterns of the gate trials each candidate that passed it passed."""

    @property
    def cached(self) -> list[Candidate]:
        """The cached ranking's candidates that can run the inputs, in its order."""
        if self.entry is None:
            return []
        ranked = {r.name for r in self.entry.ranking}
        return [c for c in by_rank(self.entry, self.usable) if c.name in ranked]

    def error(self, name: str, text: str, shown: str | None = None) -> None:
        self.notes.error(name, text)
        if shown is not None:
            self.notes.passed_over[name] = shown
        self.found[name] = ("error", text)

    def selection(self, comparison: Comparison | None = None, entry: CacheEntry | None = None,
                  order: Sequence[Candidate] = ()) -> Selection:
        return Selection(self.region, order[0] if order else None, list(order), "measured",
                         self.notes.passed_over, entry, comparison, self.reports,
                         self.notes.errors, self.rejected, self.found,
                         frozenset(c.name for c in self.gated))


def measured_arbitrate(op: Op | str, inputs: Sequence[Any], candidates: Iterable[Candidate],
                       cache: MeasureCache, *, target: str = "cpu",
                       timer: Timer | None = None, policy: ComparePolicy | None = None,
                       gate_seed: int = GATE_SEED, remeasure: bool = False,
                       needs: tuple[int, ...] = (), verdict: VerdictFn | None = None,
                       supersede: bool = False, retry_low: bool = True) -> Selection:
    """Gate the candidates, time the survivors interleaved, cache and return the fastest.

    A cache hit times nothing; its winner is re-checked with ``accepts(inputs)`` and,
    if it cannot run them, the next cached candidate that can is used. The key is
    measured again when no cached candidate can run the inputs, or when a candidate that
    can run them is new or changed (see the module). ``verdict`` replaces the plain F4
    gate call (the arbiter passes its per-process memo). ``supersede``: the new entry
    replaces the cached one in any merge (a recheck found the cached winner slower).
    ``retry_low``: a low-confidence entry is measured again (the cached leader against
    the runner-up and anything new), not used as it is.
    """
    m = _start(OPS.get(op) if isinstance(op, str) else op, inputs, candidates, cache,
               target, needs)
    if isinstance(m, Selection):
        return m
    if not remeasure:
        hit = _cache_hit(m, retry_low)
        if hit is not None:
            return hit
    partial = not remeasure and _partial(m)
    gate = verdict or _plain_gate(m, gate_seed)
    _gate_chosen(m, partial, gate)
    if partial and _nothing_new(m):
        return _cached_selection(m)
    timed = _time(m, policy, timer or timer_for(target), gate_seed) if m.survivors else None
    if timed is None or not timed[0].ranking:
        return m.selection(timed[0] if timed else None)
    comparison, alone = timed
    entry = _entry(m, comparison, alone, partial, supersede)
    cache.put(entry)
    hooks.call("pytest_arbiter_candidate_measured", entry=entry)
    return m.selection(comparison, entry, _order(m, entry, comparison))


def _start(op: Op, inputs: Sequence[Any], candidates: Iterable[Candidate],
           cache: MeasureCache, target: str, needs: tuple[int, ...]) -> Measurement | Selection:
    op.validate(*inputs)
    region = op.region_of(*inputs)
    pool = [c for c in candidates if c.target == target]
    found = probe_device(target)
    notes = Notes()
    if not isinstance(found, DeviceInfo):
        for cand in pool:
            notes.passed_over[cand.name] = f"unavailable: {found}"
        return Selection(region, None, [], "measured", notes.passed_over)
    key = CacheKey(found.tag, target, op.name, region.bucket(needs), region.dtype)
    applicable = screen(region, pool, None, notes)
    usable = [c for c in applicable if accepting(c, inputs, notes)]
    m = Measurement(op, inputs, region, found, key, cache.get(key), pool, applicable,
                    usable, notes, current_environment(target))
    m.found.update((name, ("error", why)) for name, why in notes.errors.items())
    return m


def _cache_hit(m: Measurement, retry_low: bool) -> Selection | None:
    """The cached pick, when the entry is current for the candidates that can run here
    (and, with ``retry_low``, has the evidence of a confident pick)."""
    if m.entry is None:
        return None
    m.now = freshness(m.entry, m.applicable, m.environment, [c.name for c in m.usable],
                      retry_declined=True, op=m.op)
    m.weak = retry_low and m.entry.low_confidence
    return _cached_selection(m) if m.cached and m.now.current and not m.weak else None


def _cached_selection(m: Measurement) -> Selection:
    """The pick the cache already holds, with the reasons of the kernels it passed over."""
    assert m.entry is not None
    for name, why in m.entry.rejected.items():
        m.notes.passed_over.setdefault(name, why)
    cached = m.cached
    return Selection(m.region, cached[0], cached, "cached", m.notes.passed_over, m.entry,
                     errors=m.notes.errors)


def _partial(m: Measurement) -> bool:
    """Whether only the leader, the runner-up and what is new or changed are timed (the
    entry stands for the rest), rather than every candidate that can run the inputs."""
    return (m.entry is not None and m.now is not None and bool(m.entry.considered)
            and bool(m.cached) and not m.now.winner_changed)


def _plain_gate(m: Measurement, seed: int) -> VerdictFn:
    shared = SharedTrials()  # the key's trials, prepared once for its candidates

    def gate(cand: Candidate) -> Verdict:
        report = f4_gate(cand, m.op, inputs=m.inputs, region=m.region, seed=seed,
                         trials=shared.get(m.op, m.inputs, m.region, seed))
        m.reports[cand.name] = report
        return verdict_of(report)
    return gate


def _gate_chosen(m: Measurement, partial: bool, gate: VerdictFn) -> None:
    """Gate what this comparison times: every usable candidate, or (``partial``) each new
    or changed one, then the cached ranking's other candidates in order until two passed
    (the leader and the runner-up of the rows that stand)."""
    if not partial:
        for cand in m.usable:
            _gate_one(m, cand, gate)
        return
    assert m.now is not None
    wanted = set(m.now.to_measure)
    for cand in m.usable:
        if cand.name in wanted:
            _gate_one(m, cand, gate)
    anchors = 0  # the leader and the runner-up of the rows that stand (unchanged)
    for cand in m.cached:
        if cand.name in wanted:
            continue
        if cand not in m.gated:
            _gate_one(m, cand, gate)
        anchors += cand in m.survivors
        if anchors == 2:
            break


def _gate_one(m: Measurement, cand: Candidate, gate: VerdictFn) -> None:
    kind, reason, trials = gate(cand)
    m.gated.append(cand)
    name = cand.name
    if trials:
        m.trials[name] = trials
    if kind == "pass":
        m.survivors.append(cand)
    elif kind == "decline_inputs":
        m.declined_these.append(cand)
        m.notes.passed_over[name] = f"declined the inputs: {reason}"
        m.notes.declined[name] = reason
    elif kind == "decline":
        m.notes.passed_over[name] = f"declined: {reason}"
        m.gate_declined[name] = reason
    elif kind == "reject":
        m.notes.passed_over[name] = reason
        m.rejected[name] = reason
        m.found[name] = ("rejected", reason)
    else:
        m.error(name, reason)


def _nothing_new(m: Measurement) -> bool:
    """A partial re-measure brought nothing to rank: all it had to measure were
    candidates that declined the only inputs they were tried on, and they declined these
    too; nothing changed or failed. The entry stands (no write, no plan dropped)."""
    assert m.entry is not None and m.now is not None
    retried = all(_row(m.entry, name) == "inputs_declined" for name in m.now.unmeasured)
    failed = any(c.name in m.found for c in m.gated)
    return (retried and not m.now.changed and not m.now.environment and not failed
            and not m.weak and not any(c.name in m.now.unmeasured for c in m.survivors))


def _row(entry: CacheEntry, name: str) -> str:
    seen = entry.considered.get(name)
    return seen.outcome if seen is not None else ""


def _timing_inputs(m: Measurement, seed: int) -> tuple[list[Candidate], Sequence[Any]]:
    """Who is timed, on what: the survivors on the dispatch's inputs; when a candidate
    right for the key declined these (their layout, say), every one of them on the
    key's own generated input, so the ranking holds all the key's candidates."""
    if m.declined_these and m.op.gate_inputs is not None:
        own = m.op.gate_inputs(m.region, seed)[0]
        if [np.shape(x) for x in own] == [np.shape(x) for x in m.inputs]:
            timed = [c for c in m.gated if c in m.survivors or c in m.declined_these]
            return [c for c in timed if accepting(c, own, Notes())], own
    return list(m.survivors), m.inputs


def _time(m: Measurement, policy: ComparePolicy | None, timer: Timer,
          seed: int) -> tuple[Comparison, bool] | None:
    """Time the candidates side by side, under the device's measurement lock; the
    comparison, and whether it held the lock (no other worker timed meanwhile)."""
    timed, inputs = _timing_inputs(m, seed)
    fns: dict[str, Callable[[], object]] = {}
    for cand in timed:
        try:
            prepared = cand.prepare_inputs(*inputs)
        except Exception as exc:
            text = f"while staging its inputs: {exc_text(exc)}"
            m.error(cand.name, text, text)
            continue
        fns[cand.name] = functools.partial(cand.run, *prepared)
    if not fns:
        return None
    with measurement_lock(lock_identity(m.device.tag)) as alone:
        comparison = compare_latencies(fns, tiers={c.name: c.tier for c in timed},
                                       policy=policy, timer=timer, declines=(Decline,))
    for name, why in comparison.declined.items():
        m.notes.passed_over[name] = f"declined while timed: {why}"
    for name, why in comparison.failed.items():
        m.error(name, f"while timed: {why}", f"raised while timed: {why}")
    for name, why in comparison.dropped.items():
        m.notes.passed_over[name] = why
    return comparison, alone


def _entry(m: Measurement, comparison: Comparison, alone: bool, partial: bool,
           supersede: bool) -> CacheEntry:
    """The new entry: the ranking rule, the considered rows, the provenance."""
    old = m.entry
    changed = set(m.now.changed) if m.now is not None and old is not None else set()
    failed = {*m.notes.errors, *m.rejected}
    ranking = ranked_rows(comparison, old, failed | changed)
    gone = {n: why for n, why in (old.rejected.items() if old is not None else ())
            if n not in changed}
    gone.update(m.rejected)
    gone.update((n, f"error: {why}") for n, why in m.notes.errors.items())
    for name in comparison.ranking:
        gone.pop(name, None)
    inputs_declined = m.gate_declined if m.op.gate_inputs is None else {}
    considered = considered_rows(m.pool, {c.name for c in m.applicable},
                                 {c.name for c in m.usable}, old, partial,
                                 set(comparison.ranking), m.rejected, m.notes, inputs_declined,
                                 m.trials, op=m.op)
    return CacheEntry(m.device.tag, m.key.target, m.op.name, m.key.bucket, m.key.dtype,
                      ranking, comparison.confidence, comparison.tie, gone,
                      provenance(m.device, m.inputs, comparison, alone), considered,
                      m.environment, False,
                      since_for(old, considered, m.environment, utc_now(),
                                supersede=supersede))


def _order(m: Measurement, entry: CacheEntry, comparison: Comparison) -> list[Candidate]:
    """The new entry's candidates that can run the dispatch's inputs, in its order."""
    can_run = {c.name: c for c in m.usable}
    failed = {*m.notes.errors, *m.rejected}
    timed = set(comparison.ranking)
    return [can_run[r.name] for r in entry.ranking
            if r.name in can_run and r.name not in failed
            and (can_run[r.name] in m.survivors or r.name not in timed)]
