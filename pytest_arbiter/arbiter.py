"""Arbitration: pick the candidate that runs a dispatch, by tier or by measurement.

``Arbiter.dispatch`` is the hot path: a memoised plan per input signature, the
``accepts`` re-check, one histogram count and the call. Everything slow (validation,
gating, timing, cache writes) happens once per signature, in ``_plan``.
"""

from __future__ import annotations

import datetime
import platform
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_arbiter.cache import CacheEntry, CacheKey, MeasureCache, RankedCandidate
from pytest_arbiter.candidates import REGISTRY, Candidate, CandidateRegistry, Decline
from pytest_arbiter.device import DeviceInfo, probe_device, target_of_array
from pytest_arbiter.gate import GATE_SEED, GateReport, f4_gate
from pytest_arbiter.histogram import NO_CANDIDATE, DispatchHistogram, HistogramKey
from pytest_arbiter.measure import CPU_TIMER, ComparePolicy, Comparison, Timer, compare_latencies
from pytest_arbiter.ops import OPS, Op, OpRegistry
from pytest_arbiter.regions import Region

MODES = ("tune", "static", "strict")
MAX_PLANS = 4096
"""Memoised dispatch plans (one per input signature) kept at most, per arbiter."""
_TIMERS: dict[str, Callable[[], Timer]] = {"cpu": lambda: CPU_TIMER}


def register_timer(target: str, make_timer: Callable[[], Timer]) -> None:
    """Set the timer used to measure ``target``'s candidates (the CUDA lane adds events)."""
    _TIMERS[target] = make_timer


def timer_for(target: str) -> Timer:
    make = _TIMERS.get(target)
    return make() if make is not None else CPU_TIMER


class CacheMiss(LookupError):
    """Strict mode: a dispatch key has no cached winner."""


@dataclass
class Selection:
    """What arbitration chose for one region, and why the others were passed over."""

    region: Region
    candidate: Candidate | None
    order: list[Candidate]
    source: str  # "measured", "cached", "static"
    passed_over: dict[str, str] = field(default_factory=dict)
    entry: CacheEntry | None = None
    comparison: Comparison | None = None
    gate_reports: dict[str, GateReport] = field(default_factory=dict)


def _screen(region: Region, candidates: Iterable[Candidate], inputs: Sequence[Any] | None,
            passed_over: dict[str, str], *, ranked: bool = False) -> list[Candidate]:
    """Candidates that apply, are available and accept ``inputs``.

    Highest tier first, unless ``ranked``: a cached ranking keeps its measured order.
    """
    usable = []
    ordered = list(candidates) if ranked else sorted(candidates, key=lambda c: (-c.tier, c.name))
    for cand in ordered:
        if not cand.applies_to(region):
            passed_over[cand.name] = f"does not apply to {region.describe()}"
            continue
        reason = cand.unavailable_reason()
        if reason is not None:
            passed_over[cand.name] = f"unavailable: {reason}"
            continue
        if inputs is not None:
            try:
                accepted = cand.accepts(*inputs)
            except Exception as exc:
                passed_over[cand.name] = f"accepts() raised {type(exc).__name__}: {exc}"
                continue
            if not accepted:
                passed_over[cand.name] = "declined the inputs (accepts() returned False)"
                continue
        usable.append(cand)
    return usable


def _cached_order(entry: CacheEntry, pool: Iterable[Candidate], region: Region,
                  inputs: Sequence[Any], passed_over: dict[str, str]) -> list[Candidate]:
    """The cached ranking's candidates that can run ``inputs``, in their measured order."""
    by_name = {c.name: c for c in pool}
    ranked = [by_name[r.name] for r in entry.ranking if r.name in by_name]
    return _screen(region, ranked, inputs, passed_over, ranked=True)


def arbitrate(region: Region, candidates: Iterable[Candidate],
              inputs: Sequence[Any] | None = None) -> Selection:
    """Static pick: the highest-tier candidate that applies, is available and accepts."""
    passed_over: dict[str, str] = {}
    usable = _screen(region, candidates, inputs, passed_over)
    return Selection(region, usable[0] if usable else None, usable, "static", passed_over)


def _provenance(device: DeviceInfo | None, inputs: Sequence[Any],
                comparison: Comparison) -> dict[str, Any]:
    from pytest_arbiter import __version__

    return {
        "host": socket.gethostname(),
        "device_name": device.name if device else "",
        "versions": {"pytest-arbiter": __version__, "numpy": np.__version__,
                     "python": platform.python_version()},
        "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ"),
        "shapes": [list(np.shape(x)) for x in inputs],
        "rounds": comparison.rounds,
        "timed_ns": round(comparison.timed_ns),
        "spent_ns": round(comparison.spent_ns),
        "p_value": comparison.p_value,
    }


def measured_arbitrate(op: Op | str, inputs: Sequence[Any], candidates: Iterable[Candidate],
                       cache: MeasureCache, *, target: str = "cpu",
                       timer: Timer | None = None, policy: ComparePolicy | None = None,
                       gate_seed: int = GATE_SEED, remeasure: bool = False) -> Selection:
    """Gate the candidates, time the survivors interleaved, cache and return the fastest.

    A cache hit times nothing; its winner is re-checked with ``accepts(inputs)`` and,
    if it cannot run them, the next-fastest cached candidate that can is used. Only
    when no cached candidate can run the inputs is the key measured again.
    """
    the_op = OPS.get(op) if isinstance(op, str) else op
    the_op.validate(*inputs)
    region = the_op.region_of(*inputs)
    pool = [c for c in candidates if c.target == target]
    found = probe_device(target)
    device = found if isinstance(found, DeviceInfo) else None
    passed_over: dict[str, str] = {}
    if device is None:
        for cand in pool:
            passed_over[cand.name] = f"unavailable: {found}"
        return Selection(region, None, [], "measured", passed_over)
    key: CacheKey = (device.tag, target, the_op.name, region.bucket(), region.dtype)
    entry = cache.get(key)
    if entry is not None and not remeasure:
        order = _cached_order(entry, pool, region, inputs, passed_over)
        for name, why in entry.rejected.items():
            passed_over.setdefault(name, why)
        if order:
            return Selection(region, order[0], order, "cached", passed_over, entry)
    usable = _screen(region, pool, inputs, passed_over)
    reports: dict[str, GateReport] = {}
    survivors = []
    for cand in usable:
        report = f4_gate(cand, the_op, inputs=inputs, region=region, seed=gate_seed)
        reports[cand.name] = report
        if report.passed:
            survivors.append(cand)
        else:
            passed_over[cand.name] = f"failed the F4 gate: {report.reason}"
    if not survivors:
        return Selection(region, None, [], "measured", passed_over, gate_reports=reports)
    fns = {}
    for cand in survivors:
        prepared = cand.prepare_inputs(*inputs)
        fns[cand.name] = (lambda c=cand, args=prepared: c.run(*args))
    comparison = compare_latencies(fns, tiers={c.name: c.tier for c in survivors},
                                   policy=policy, timer=timer or timer_for(target))
    by_name = {c.name: c for c in survivors}
    ranking = [RankedCandidate(n, comparison.stats[n]) for n in comparison.ranking]
    if entry is not None:
        ranking += [r for r in entry.ranking if r.name not in comparison.stats]
    rejected = {n: passed_over[n] for n in reports if n in passed_over}
    new_entry = CacheEntry(device.tag, target, the_op.name, region.bucket(), region.dtype,
                           tuple(ranking), comparison.confidence, comparison.tie, rejected,
                           _provenance(device, inputs, comparison))
    cache.put(new_entry)
    order = [by_name[n] for n in comparison.ranking]
    return Selection(region, order[0], order, "measured", passed_over, new_entry, comparison,
                     reports)


@dataclass
class _Step:
    cand: Candidate
    won: HistogramKey
    degraded: HistogramKey
    error: HistogramKey
    accepts: Callable[..., bool]
    run: Callable[..., Any]
    count_won: Callable[[], int]


@dataclass
class _Plan:
    """The memoised dispatch of one input signature.

    ``accepts``, ``run`` and ``count_won`` are the first-ranked step's, lifted out so
    the hot path reads them in one attribute load each (``None`` when there is no step).
    """

    op: Op
    key: tuple[str, ...]
    steps: list[_Step]
    no_candidate: HistogramKey
    registry_generation: int
    cache_version: int
    accepts: Callable[..., bool] | None = None
    run: Callable[..., Any] | None = None
    count_won: Callable[[], int] | None = None

    def __post_init__(self) -> None:
        if self.steps:
            first = self.steps[0]
            self.accepts, self.run, self.count_won = first.accepts, first.run, first.count_won


@dataclass
class DispatchEvent:
    """Why a key dispatched as it did: the source of its pick and the passed-over reasons."""

    target: str
    op: str
    bucket: str
    dtype: str
    source: str
    order: list[str]
    passed_over: dict[str, str]
    ratios: dict[str, float] = field(default_factory=dict)
    tie: bool = False
    confidence: float = 1.0


class Arbiter:
    """Dispatches ops to candidates and records every dispatch in a histogram.

    ``mode``: ``tune`` measures at the first cache miss; ``static`` uses the tier order
    on a miss; ``strict`` makes a miss an error (CI replay of a committed cache).
    """

    def __init__(self, *, registry: CandidateRegistry | None = None,
                 ops: OpRegistry | None = None, cache: MeasureCache | None = None,
                 histogram: DispatchHistogram | None = None, mode: str = "tune",
                 policy: ComparePolicy | None = None, gate_seed: int = GATE_SEED) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown arbiter mode {mode!r}; modes are {', '.join(MODES)}")
        self.registry = registry if registry is not None else REGISTRY
        self.ops = ops if ops is not None else OPS
        self.cache = cache if cache is not None else MeasureCache()
        self.histogram = histogram if histogram is not None else DispatchHistogram()
        self.mode = mode
        self.policy = policy
        self.gate_seed = gate_seed
        self.events: dict[tuple[str, ...], DispatchEvent] = {}
        self.declines: dict[tuple[str, str, str], str] = {}
        self.errors: dict[tuple[str, str, str], str] = {}
        self._plans: dict[Any, _Plan] = {}
        self._lock = threading.RLock()

    def dispatch(self, op: str, *inputs: Any, target: str | None = None) -> Any:
        """Run ``op`` on ``inputs`` with the arbitrated candidate and record the outcome."""
        # The hot path (see docs/performance.md for the profile behind it): one signature
        # tuple and dict lookup, two staleness checks, the ``accepts`` re-check, the call
        # and one lock-free count. Everything else is in ``_plan`` / ``_run_unplanned``.
        try:
            if len(inputs) == 2:
                a, b = inputs
                sig: Any = (op, target, a.__class__, a.shape, a.dtype,
                            b.__class__, b.shape, b.dtype)
            else:
                sig = (op, target, *[(x.__class__, x.shape, x.dtype) for x in inputs])
            plan = self._plans.get(sig)
        except (AttributeError, TypeError):
            sig, plan = None, None
        if (plan is None or plan.registry_generation != self.registry.generation
                or plan.cache_version != self.cache.version):
            plan = self._plan(op, inputs, target, sig)
        accepts = plan.accepts
        if accepts is not None and accepts(*inputs):
            try:
                out = plan.run(*inputs)  # type: ignore[misc]
            except Decline as dec:
                first = plan.steps[0]
                self.histogram.add(first.degraded)
                self.declines[first.degraded[:3]] = dec.reason
                return plan.op.reference(*inputs)
            except Exception as exc:
                first = plan.steps[0]
                self.histogram.add(first.error)
                self.errors[first.error[:3]] = f"{type(exc).__name__}: {exc}"
                return self._run_unplanned(plan, inputs, start=1, accepted=True)
            plan.count_won()  # type: ignore[misc]
            return out
        return self._run_unplanned(plan, inputs)

    def _run_unplanned(self, plan: _Plan, inputs: Sequence[Any], *, start: int = 0,
                       accepted: bool = False, replanned: bool = False) -> Any:
        """Every path but the first-ranked candidate's success: declines, errors, fallbacks."""
        for step in plan.steps[start:]:
            if not step.cand.accepts(*inputs):
                continue
            accepted = True
            try:
                out = step.cand.run(*inputs)
            except Decline as dec:
                self.histogram.add(step.degraded)
                self.declines[step.degraded[:3]] = dec.reason
                return plan.op.reference(*inputs)
            except Exception as exc:
                self.histogram.add(step.error)
                self.errors[step.error[:3]] = f"{type(exc).__name__}: {exc}"
                continue
            step.count_won()
            return out
        if plan.steps and not accepted and not replanned:
            # none of the planned candidates can run these inputs (strides, say):
            # plan afresh for them: the cached ranking first, measuring only if none can
            target = plan.key[0]
            fresh = self._plan(plan.op.name, inputs, target, None)
            return self._run_unplanned(fresh, inputs, replanned=True)
        if not accepted:
            self.histogram.add(plan.no_candidate)
        return plan.op.reference(*inputs)  # every candidate raised; errors are recorded

    def _plan(self, op_name: str, inputs: Sequence[Any], target: str | None,
              sig: Any) -> _Plan:
        the_op = self.ops.get(op_name)
        the_op.validate(*inputs)
        resolved = target if target is not None else (
            target_of_array(inputs[0]) if inputs else "cpu")
        with self._lock:
            generation = self.registry.generation
            selection = self._select(the_op, inputs, resolved)
            version = self.cache.version
            key = (resolved, the_op.name, selection.region.bucket(), selection.region.dtype)
            self._note(key, selection)
            steps = [_Step(c, (resolved, the_op.name, c.name, "won"),
                           (resolved, the_op.name, c.name, "degraded"),
                           (resolved, the_op.name, c.name, "error"), c.accepts, c.run,
                           self.histogram.counter((resolved, the_op.name, c.name, "won")))
                     for c in selection.order]
            fallback: HistogramKey = (resolved, the_op.name, NO_CANDIDATE, "no_candidate")
            if not selection.order and selection.gate_reports:
                # candidates could run these inputs but none passed the F4 gate, so the
                # reference runs in their place: the silent degrade, not "nothing applied"
                first = next(iter(selection.gate_reports))
                fallback = (resolved, the_op.name, first, "degraded")
                self.declines[fallback[:3]] = (
                    f"failed the F4 gate: {selection.gate_reports[first].reason}")
            plan = _Plan(the_op, key, steps, fallback, generation, version)
            if sig is not None:
                if len(self._plans) >= MAX_PLANS:
                    self._plans.clear()  # bounded memory; a dropped plan is rebuilt from the cache
                self._plans[sig] = plan
        return plan

    def _select(self, the_op: Op, inputs: Sequence[Any], target: str) -> Selection:
        pool = self.registry.for_op(the_op.name, target)
        if self.mode == "tune":
            return measured_arbitrate(the_op, inputs, pool, self.cache, target=target,
                                      policy=self.policy, gate_seed=self.gate_seed)
        region = the_op.region_of(*inputs)
        found = probe_device(target)
        if isinstance(found, DeviceInfo):
            entry = self.cache.get((found.tag, target, the_op.name, region.bucket(),
                                    region.dtype))
            if entry is not None:
                passed: dict[str, str] = {}
                order = _cached_order(entry, pool, region, inputs, passed)
                if order:
                    return Selection(region, order[0], order, "cached", passed, entry)
        selection = arbitrate(region, pool, inputs)
        if selection.candidate is not None and self.mode == "strict":
            raise CacheMiss(
                f"strict mode: no cached winner for {region.describe()} on target {target!r} "
                f"(device {found.tag if isinstance(found, DeviceInfo) else found}, bucket "
                f"{region.bucket()}); tune with --arbiter-tune or add the entry to the cache")
        return selection

    def _note(self, key: tuple[str, ...], selection: Selection) -> None:
        previous = self.events.get(key)
        source = selection.source
        if previous is not None and previous.source == "measured":
            source = "measured"
        comparison = selection.comparison
        entry = selection.entry
        ratios: dict[str, float] = {}
        if comparison is not None:
            ratios = comparison.ratios
        elif entry is not None and entry.ranking:
            best = entry.ranking[0].stats.median_ns
            ratios = {r.name: r.stats.median_ns / best for r in entry.ranking if best > 0}
        self.events[key] = DispatchEvent(
            key[0], key[1], key[2], key[3], source, [c.name for c in selection.order],
            dict(selection.passed_over), ratios,
            entry.tie if entry else False, entry.confidence if entry else 1.0)

    def gate(self, candidate_name: str, *inputs: Any, seed: int | None = None) -> GateReport:
        """F4-gate one registered candidate on ``inputs`` (and the op's generated inputs)."""
        cand = self.registry.get(candidate_name)
        the_op = self.ops.get(cand.op)
        return f4_gate(cand, the_op, inputs=inputs, seed=self.gate_seed if seed is None else seed)

    def gate_region(self, candidate_name: str, region: Region,
                    seed: int | None = None) -> GateReport:
        cand = self.registry.get(candidate_name)
        return f4_gate(cand, self.ops.get(cand.op), region=region,
                       seed=self.gate_seed if seed is None else seed)


_DEFAULTS: dict[str, Arbiter] = {}
_DEFAULT_HISTOGRAM = DispatchHistogram()
_DEFAULT_CACHE = MeasureCache()


def default_arbiter(mode: str = "tune") -> Arbiter:
    """The process-wide arbiter for ``mode``; all modes share one histogram and cache."""
    found = _DEFAULTS.get(mode)
    if found is None:
        found = _DEFAULTS.setdefault(
            mode, Arbiter(mode=mode, cache=_DEFAULT_CACHE, histogram=_DEFAULT_HISTOGRAM))
    return found


def run_arbitrated(op: str, *inputs: Any, target: str | None = None) -> Any:
    """Dispatch with the static tier order (cached winners still apply) and record it."""
    return default_arbiter("static").dispatch(op, *inputs, target=target)


def run_measured_arbitrated(op: str, *inputs: Any, target: str | None = None) -> Any:
    """Dispatch with measured arbitration (measure at first miss) and record it."""
    return default_arbiter("tune").dispatch(op, *inputs, target=target)


def dispatch_histogram(target: str | None = None, op: str | None = None
                       ) -> dict[HistogramKey, int]:
    """Counts per (target, op, selected, outcome) of the process-wide arbiter."""
    return _DEFAULT_HISTOGRAM.counts(target=target, op=op)
