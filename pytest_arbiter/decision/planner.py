"""Planning one dispatch key: measure it (tune), read and check its cache entry, re-time
it (recheck), and lay out its steps, with the findings and the event of the key.

Each step is a short function over one :class:`_Planning`; :func:`build_keyplan` runs
them in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.ops import Op
from pytest_arbiter.core.regions import Region
from pytest_arbiter.decision.context import ArbiterParts
from pytest_arbiter.decision.freshness import freshness, row_current, vouched
from pytest_arbiter.decision.plans import Fallback, KeyPlan, Step, default_accepts
from pytest_arbiter.decision.rechecking import recheck_text, status_of
from pytest_arbiter.decision.screen import Notes, accepting, by_rank, screen, usable
from pytest_arbiter.decision.selection import DispatchEvent, Selection
from pytest_arbiter.decision.states import DispatchKey, Mode, Source
from pytest_arbiter.decision.tuning import measured_arbitrate
from pytest_arbiter.errors import CacheMiss, LowConfidence, StaleEntry
from pytest_arbiter.extend.backends import DeviceInfo
from pytest_arbiter.extend.device import probe_device
from pytest_arbiter.extend.fingerprint import current_environment
from pytest_arbiter.gating.histogram import HistogramKey, Outcome
from pytest_arbiter.store.cache import CacheEntry, CacheKey
from pytest_arbiter.store.safetext import counted


@dataclass
class _Planning:
    arb: ArbiterParts
    mode: Mode
    op: Op
    region: Region
    needs: tuple[int, ...]
    key: DispatchKey
    inputs: Sequence[Any]
    pool: list[Candidate]
    device: DeviceInfo
    ckey: CacheKey
    notes: Notes = field(default_factory=Notes)
    selection: Selection | None = None
    entry: CacheEntry | None = None
    stale: dict[str, str] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)

    def measure(self, *, remeasure: bool = False) -> None:
        """Measure the key (a low-confidence entry once per process, so a re-plan of
        the key does not time it again and again)."""
        arb = self.arb
        retry_low = self.ckey not in arb.plans.measured
        arb.plans.measured.add(self.ckey)
        self.selection = measured_arbitrate(
            self.op, self.inputs, self.pool, arb.cache, target=self.key.target,
            policy=arb.config.compare_policy(), gate_seed=arb.config.gate_seed,
            needs=self.needs, remeasure=remeasure, supersede=remeasure, retry_low=retry_low,
            verdict=lambda c: arb.gates.verdict(self.op, self.key, c, self.inputs))
        self.notes.errors.update(self.selection.errors)
        self.notes.passed_over.update(self.selection.passed_over)

    @property
    def source(self) -> Source:
        if self.selection is not None:
            return self.selection.source
        return "cached" if self.entry is not None else "static"


def build_keyplan(arb: ArbiterParts, mode: Mode, op: Op, region: Region, needs: tuple[int, ...],
                  key: DispatchKey, inputs: Sequence[Any]) -> KeyPlan:
    """The key's plan in ``mode``, built from the measurement, the cache and the pool."""
    pool = arb.registry.for_op(op.name, key.target)
    # the op was planned: "" stands for none registered
    names = [c.name for c in pool] or [""]
    arb.plans.registered.update((key.target, op.name, name) for name in names)
    found = probe_device(key.target)
    stamp = arb.stamp()
    if not isinstance(found, DeviceInfo):
        notes = Notes({c.name: f"unavailable: {found}" for c in pool})
        kp = KeyPlan(op, key, mode, (), f"no {key.target} device: {found}", stamp)
        _event(arb, key, "static", [], notes, None, None, {})
        return kp
    ckey = CacheKey(found.tag, key.target, op.name, key.bucket, key.dtype)
    p = _Planning(arb, mode, op, region, needs, key, inputs, pool, found, ckey)
    if mode == "tune":
        _tune(p)
    _read_entry(p)
    _maybe_recheck(p)
    _record_findings(p)
    steps = _steps(p, _order(p))
    kp = KeyPlan(op, key, mode, tuple(steps), _why_none(p), stamp, _retry(p), _fallback(p))
    if kp.fallback is not None:
        kp.degraded = arb.record.histogram.counter(
            HistogramKey(key.target, op.name, kp.fallback.winner, "degraded"))
    why_not = {**p.notes.passed_over, **p.notes.errors}
    _event(arb, key, p.source, [s.cand.name for s in steps if s.cand.name not in why_not],
           p.notes, p.selection, p.entry, p.stale)
    return kp


def _tune(p: _Planning) -> None:
    """Measure the key; a cached leader that failed the gate for a numerical reason on
    another key of the op, and fails it here too (with that pattern), is measured out:
    the key again, every candidate, and the new entry supersedes the old."""
    p.measure()
    chosen = p.selection
    leader = chosen.candidate if chosen is not None and chosen.source == "cached" else None
    gates = p.arb.gates
    if leader is not None and gates.suspect(p.key, leader) and gates.verdict(
            p.op, p.key, leader, p.inputs).kind in ("reject", "error"):
        p.measure(remeasure=True)


def _read_entry(p: _Planning) -> None:
    """The key's entry, if it still describes this run's candidates (strict mode: an
    out-of-date or low-confidence entry, or none where a candidate could run, raises)."""
    p.environment = current_environment(p.key.target)
    entry = p.arb.cache.get(p.ckey)
    if entry is None:
        _strict_miss(p)
        return
    applicable = screen(p.region, p.pool, None, Notes())
    fresh = freshness(entry, applicable, p.environment,
                      [c.name for c in applicable if accepting(c, p.inputs, Notes())],
                      op=p.op)
    p.stale = fresh.notes(entry.winner)
    if p.mode == "strict":
        if fresh.winner_changed or fresh.to_measure:
            raise StaleEntry(
                f"strict mode: the cached entry of {_where(p)} is stale: "
                + "; ".join(v for k, v in sorted(p.stale.items()) if k != "reverify")
                + "; tune with --arbiter-tune")
        if entry.low_confidence:
            rounds = entry.provenance.rounds
            raise LowConfidence(
                f"strict mode: the cached pick of {_where(p)} is low-confidence "
                f"({entry.winner}, confidence {entry.confidence:.3g}, "
                f"{counted(rounds, 'round') if rounds else '? rounds'}): re-tune it "
                "(pytest --arbiter-tune measures it again; a larger --arbiter-tune-budget "
                "gives it more rounds)")
    p.entry = None if fresh.winner_changed else entry  # else its timings are of other code


def _where(p: _Planning) -> str:
    return (f"{p.region.describe()} on target {p.key.target!r} (device {p.device.tag}, "
            f"bucket {p.key.bucket})")


def _strict_miss(p: _Planning) -> None:
    """Strict mode and no entry: a miss, if a candidate that passes the gate could run
    the inputs (a key whose every candidate fails the gate has no entry to tune: the
    reference runs, and the failures are recorded)."""
    if p.mode != "strict":
        return
    can_run = screen(p.region, p.pool, p.inputs, Notes())
    gates = p.arb.gates
    if any(gates.verdict(p.op, p.key, c, p.inputs).kind not in ("reject", "error")
           for c in can_run):
        raise CacheMiss(f"strict mode: no cached winner for {_where(p)}; tune with "
                        "--arbiter-tune or add the entry to the cache")


def _maybe_recheck(p: _Planning) -> None:
    """Re-time a cached key once per process (``--arbiter-recheck``); a tuning run
    measures a key found stale again, and the re-measurement replaces the entry."""
    arb = p.arb
    if (p.entry is None or (p.selection is not None and p.selection.source != "cached")
            or not arb.recheck.reserve(p.ckey)):
        return
    result = arb.recheck.run(p.ckey, p.entry, p.pool, p.region, p.inputs,
                             lambda c: arb.gates.verdict(p.op, p.key, c, p.inputs))
    if result is None or not result.stale:
        return
    arb.record.finding(p.key, result.winner, "stale",
                       f"{'/'.join(p.ckey)}: {recheck_text(result)}")
    if p.mode == "tune":
        p.measure(remeasure=True)
        p.entry = arb.cache.get(p.ckey)


def _record_findings(p: _Planning) -> None:
    """What the measurement found failing, and what the entry says failed the gate when
    measured (a replay: unchanged code, not gated again now), once per key and run."""
    record = p.arb.record
    gated: frozenset[str] = frozenset()
    if p.selection is not None:
        gated = p.selection.gated
        for name, (outcome, reason) in sorted(p.selection.found.items()):
            record.finding(p.key, name, outcome, reason)
    if p.entry is None or not p.arb.config.gate:
        return
    for cand in p.pool:
        seen = p.entry.considered.get(cand.name)
        if (seen is None or seen.outcome not in ("rejected", "error") or cand.name in gated
                or not row_current(seen, cand, p.op)
                or not usable(cand, p.region, Notes())):
            continue
        why = p.entry.rejected.get(cand.name, seen.reason).removeprefix("error: ")
        kind: Outcome = "rejected" if seen.outcome == "rejected" else "error"
        record.finding(p.key, cand.name, kind, f"when measured: {why}")


def _order(p: _Planning) -> list[Candidate]:
    """The key's candidates in the order a dispatch tries them."""
    entry = p.entry
    if entry is None:
        return list(p.pool)
    order = by_rank(entry, p.pool)
    if p.arb.config.gate:
        return order
    # the gate off: what the entry says failed the gate never runs
    for name, why in entry.rejected.items():
        p.notes.passed_over.setdefault(name, f"passed over when measured: {why}")
    return [c for c in order if c.name not in entry.rejected]


def _steps(p: _Planning, order: list[Candidate]) -> list[Step]:
    """One step per candidate that applies and is available (or whose ``available()``
    raised: blocked, an error on each dispatch that reaches it)."""
    arb, steps = p.arb, []
    for cand in order:
        own = Notes()
        if not usable(cand, p.region, own):
            p.notes.passed_over.update(own.passed_over)
            p.notes.unavailable.update(own.unavailable)
            if not own.errors:
                continue
        elif cand.name not in p.notes.passed_over:
            accepting(cand, p.inputs, p.notes)  # the explain text, no more
        blocked = None
        if own.errors:
            p.notes.errors.update(own.errors)
            blocked = (HistogramKey(p.key.target, p.op.name, cand.name, "error"),
                       own.errors[cand.name])
            arb.record.note(*blocked)
        won = arb.record.histogram.counter(
            HistogramKey(p.key.target, p.op.name, cand.name, "won"))
        steps.append(Step(cand, default_accepts(cand), cand.run, won, blocked,
                          p.entry is not None and vouched(p.entry, cand, p.environment)))
    return steps


def _why_none(p: _Planning) -> str:
    if not p.pool:
        return f"no candidate of {p.op.name!r} is registered for target {p.key.target!r}"
    return "; ".join(f"{n}: {r}" for n, r in sorted(p.notes.passed_over.items())) or (
        "no candidate applies")


def _retry(p: _Planning) -> bool:
    """Tuning, and the entry has a candidate that declined the only inputs it was tried on."""
    entry = p.entry
    return p.mode == "tune" and entry is not None and any(
        (row := entry.considered.get(c.name)) is not None and row.outcome == "inputs_declined"
        for c in p.pool)


def _fallback(p: _Planning) -> Fallback | None:
    """The entry's winner, when it is not the candidate that would serve every dispatch
    here by right: it is unavailable here, or it may decline inputs it was measured on."""
    entry = p.entry
    if entry is None:
        return None
    winner = entry.winner
    cand = next((c for c in p.pool if c.name == winner), None)
    why = ""
    if cand is None:
        why = "not registered in this run: its module, or a package it needs, is missing"
    else:
        own = Notes()
        if not usable(cand, p.region, own):
            if winner not in own.unavailable:
                return None  # it does not apply, or raised: recorded as what it is
            why = f"unavailable: {own.unavailable[winner]}"
    measured = tuple(tuple(s) for s in entry.provenance.shape_lists or ())
    return Fallback(winner, why, measured, _slowdowns(entry), cand is not None,
                    p.arb.config.compare_policy().tie_margin)


def _slowdowns(entry: CacheEntry) -> dict[str, float]:
    """Each row's paired ratio to the winner; a row without one (an entry written by
    hand), its median over the winner's. A carried row was not timed beside the winner:
    no slowdown from it."""
    return {r.name: ratio for r in entry.ranking
            if (ratio := entry.over_winner(r)) is not None}


def _event(arb: ArbiterParts, key: DispatchKey, source: Source, order: list[str], notes: Notes,
           selection: Selection | None, entry: CacheEntry | None,
           stale: dict[str, str]) -> None:
    """Why the key dispatched as it did (a measured event is never replaced by another)."""
    previous = arb.events.get(key)
    if previous is not None and previous.source == "measured":
        source = "measured"
    ratios: dict[str, float] = {}
    if selection is not None and selection.comparison is not None:
        ratios = dict(selection.comparison.ratios)
    elif entry is not None:
        ratios = _slowdowns(entry)  # what show prints; none for a carried row
    ckey = CacheKey(entry.device, *key) if entry is not None else None
    rechecked = ckey is not None and ckey in arb.recheck.results
    result = arb.recheck.results.get(ckey) if ckey is not None else None
    arb.events[key] = DispatchEvent(
        *key, source, order, {**notes.passed_over, **notes.errors}, ratios,
        entry.tie if entry else False, entry.confidence if entry else 1.0, dict(stale),
        recheck_text(result) if rechecked else (previous.recheck if previous else ""),
        status_of(result) if rechecked else (previous.recheck_status if previous else ""),
        previous.ran if previous else "", previous.fallback if previous else "",
        entry.low_confidence if entry else False,
        previous.winner_out if previous else "")
