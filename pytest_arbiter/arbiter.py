"""Arbitration: pick the candidate that runs a dispatch, by tier or by measurement.

``Arbiter.dispatch`` is the hot path: a memoised plan per input signature, the first
candidate's ``accepts`` re-check, the call and one histogram count. Everything slow
(validation, the F4 gate, timing, cache writes, declines, errors) happens once per
signature in ``_plan``, or on the slow path, ``_run_slow``.

Lead-safety: with the gate on (every pytest run), a candidate runs for a dispatch key
only after it passed the F4 gate for that key in this process; one that fails is
passed over and recorded as ``rejected`` on every dispatch it would have served.
"""

from __future__ import annotations

import datetime
import platform
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
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
MAX_PLANS = 1 << 17
"""Memoised dispatch plans (one per input signature) per generation; two generations
are kept, so up to twice this many signatures dispatch without re-planning."""
DEFAULT_CALL_TIMEOUT_S = 60.0
"""The per-call watchdog's default: a gate or timing call this long is a hang."""

_TIMERS: dict[str, Callable[[], Timer]] = {"cpu": lambda: CPU_TIMER}

DispatchKey = tuple[str, str, str, str]
"""(target, op, bucket, dtype): what one memoised pick serves."""


def register_timer(target: str, make_timer: Callable[[], Timer]) -> None:
    """Set the timer used to measure ``target``'s candidates (the CUDA lane adds events)."""
    _TIMERS[target] = make_timer


def timer_for(target: str) -> Timer:
    make = _TIMERS.get(target)
    return make() if make is not None else CPU_TIMER


class CacheMiss(LookupError):
    """Strict mode: a dispatch key has no cached winner."""


def _exc_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass
class Selection:
    """What arbitration chose for one region, and why the others were passed over.

    ``errors``: candidates that raised (in ``accepts``/``available``, the gate or the
    timing); ``rejected``: candidates that failed the F4 gate, with the gate's reason.
    """

    region: Region
    candidate: Candidate | None
    order: list[Candidate]
    source: str  # "measured", "cached", "static"
    passed_over: dict[str, str] = field(default_factory=dict)
    entry: CacheEntry | None = None
    comparison: Comparison | None = None
    gate_reports: dict[str, GateReport] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)


def _usable(cand: Candidate, region: Region, passed_over: dict[str, str],
            errors: dict[str, str] | None) -> bool:
    """Whether ``cand`` applies to ``region`` and is available; a raise is an error."""
    try:
        if not cand.applies_to(region):
            passed_over[cand.name] = f"does not apply to {region.describe()}"
            return False
        reason = cand.unavailable_reason()
    except Exception as exc:
        text = f"available() raised {_exc_text(exc)}"
        passed_over[cand.name] = text
        if errors is not None:
            errors[cand.name] = text
        return False
    if reason is not None:
        passed_over[cand.name] = f"unavailable: {reason}"
        return False
    return True


def _accepts(cand: Candidate, inputs: Sequence[Any], passed_over: dict[str, str],
             errors: dict[str, str] | None) -> bool:
    try:
        accepted = cand.accepts(*inputs)
    except Decline as dec:
        passed_over[cand.name] = f"declined the inputs: {dec.reason}"
        return False
    except Exception as exc:
        text = f"accepts() raised {_exc_text(exc)}"
        passed_over[cand.name] = text
        if errors is not None:
            errors[cand.name] = text
        return False
    if not accepted:
        passed_over[cand.name] = "declined the inputs (accepts() returned False)"
        return False
    return True


def _screen(region: Region, candidates: Iterable[Candidate], inputs: Sequence[Any] | None,
            passed_over: dict[str, str], *, ranked: bool = False,
            errors: dict[str, str] | None = None) -> list[Candidate]:
    """Candidates that apply, are available and accept ``inputs``.

    Highest tier first, unless ``ranked``: a cached ranking keeps its measured order.
    """
    ordered = list(candidates) if ranked else sorted(candidates, key=lambda c: (-c.tier, c.name))
    return [c for c in ordered if _usable(c, region, passed_over, errors)
            and (inputs is None or _accepts(c, inputs, passed_over, errors))]


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
    errors: dict[str, str] = {}
    usable = _screen(region, candidates, inputs, passed_over, errors=errors)
    return Selection(region, usable[0] if usable else None, usable, "static", passed_over,
                     errors=errors)


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


def _merged_ranking(fresh: list[RankedCandidate], old: CacheEntry | None,
                    drop: Iterable[str]) -> tuple[RankedCandidate, ...]:
    """The fresh ranking, with the old entry's other rows slotted in by median."""
    if old is None:
        return tuple(fresh)
    skip = {r.name for r in fresh} | set(drop)
    merged = list(fresh)
    for row in old.ranking:
        if row.name in skip:
            continue
        at = next((i for i, r in enumerate(merged)
                   if r.stats.median_ns > row.stats.median_ns), len(merged))
        merged.insert(at, row)
    return tuple(merged)


GateFn = Callable[[Candidate], GateReport]


def _gate_verdict(report: GateReport) -> tuple[str, str]:
    """``(kind, reason)`` of one gate report: ``pass``, ``reject``, ``error``, ``decline``
    (nothing checked) or ``decline-inputs`` (right, but declined the dispatch's inputs)."""
    if report.error:
        return "error", f"in the F4 gate: {report.error}"
    if report.rejected:
        return "reject", f"failed the F4 gate: {_gate_line(report)}"
    if not report.passed:
        return "decline", _decline_text(report) or report.reason or "declined every gate input"
    if report.declined_inputs:
        return "decline-inputs", _decline_text(report)
    return "pass", ""


def _decline_text(report: GateReport) -> str:
    """The reason the dispatch's own inputs were declined (trial 0), if they were."""
    first = report.trials[0] if report.trials else None
    if first is None or first.seed is not None or first.status != "declined":
        return ""
    return first.reason.removeprefix("Decline: ")


def _gate_line(report: GateReport) -> str:
    """One line: what failed, how far out of budget, on which input and seed."""
    failing = report.failing
    where = f" (input #{failing.index}: {failing.shapes}, seed {failing.seed})" if failing else ""
    return f"{report.reason}{where}"


def measured_arbitrate(op: Op | str, inputs: Sequence[Any], candidates: Iterable[Candidate],
                       cache: MeasureCache, *, target: str = "cpu",
                       timer: Timer | None = None, policy: ComparePolicy | None = None,
                       gate_seed: int = GATE_SEED, remeasure: bool = False,
                       needs: tuple[int, ...] = (), gate: GateFn | None = None) -> Selection:
    """Gate the candidates, time the survivors interleaved, cache and return the fastest.

    A cache hit times nothing; its winner is re-checked with ``accepts(inputs)`` and,
    if it cannot run them, the next-fastest cached candidate that can is used. The key
    is measured again when no cached candidate can run the inputs, or when a candidate
    that can run them was never measured for it (it joins the ranking). ``gate``
    replaces the plain F4 gate call (the arbiter passes its per-process memo).
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
    key: CacheKey = (device.tag, target, the_op.name, region.bucket(needs), region.dtype)
    entry = cache.get(key)
    errors: dict[str, str] = {}
    usable = _screen(region, pool, inputs, passed_over, errors=errors)
    if entry is not None and not remeasure:
        known = {r.name for r in entry.ranking} | set(entry.rejected)
        cached = [c for c in (_by_rank(entry, usable)) if c.name in known]
        if cached and all(c.name in known for c in usable):
            for name, why in entry.rejected.items():
                passed_over.setdefault(name, why)
            return Selection(region, cached[0], cached, "cached", passed_over, entry,
                             errors=errors)
    reports: dict[str, GateReport] = {}
    rejected: dict[str, str] = {}
    survivors = []
    declined_these: list[Candidate] = []
    for cand in usable:
        report = gate(cand) if gate is not None else f4_gate(
            cand, the_op, inputs=inputs, region=region, seed=gate_seed)
        reports[cand.name] = report
        kind, reason = _gate_verdict(report)
        if kind == "pass":
            survivors.append(cand)
            continue
        if kind == "decline-inputs":
            declined_these.append(cand)
        passed_over[cand.name] = {"decline": f"declined: {reason}",
                                  "decline-inputs": f"declined the inputs: {reason}"
                                  }.get(kind, reason)
        if kind == "reject":
            rejected[cand.name] = reason
        elif kind == "error":
            errors[cand.name] = reason
    if not survivors:
        return Selection(region, None, [], "measured", passed_over, gate_reports=reports,
                         errors=errors, rejected=rejected)
    timed, timed_inputs = survivors, inputs
    if declined_these and the_op.gate_inputs is not None:
        # a candidate right for the key declined these inputs (their layout, say): time
        # every one of them on the key's own generated input, so the ranking holds all
        # the key's candidates whichever input came first
        own = the_op.gate_inputs(region, gate_seed)[0]
        if [np.shape(x) for x in own] == [np.shape(x) for x in inputs]:
            timed_inputs = own
            timed = [c for c in usable if c in survivors or c in declined_these
                     if _accepts(c, own, {}, None)]
    fns = {}
    for cand in timed:
        prepared = cand.prepare_inputs(*timed_inputs)
        fns[cand.name] = (lambda c=cand, args=prepared: c.run(*args))
    comparison = compare_latencies(fns, tiers={c.name: c.tier for c in timed},
                                   policy=policy, timer=timer or timer_for(target))
    for name, why in comparison.failed.items():
        if why.startswith(f"{Decline.__name__}: "):
            passed_over[name] = f"declined while timed: {why.split(': ', 1)[1]}"
            continue
        errors[name] = f"while timed: {why}"
        passed_over[name] = f"raised while timed: {why}"
    for name, why in comparison.dropped.items():
        passed_over[name] = why
    by_name = {c.name: c for c in timed}
    if not comparison.ranking:
        return Selection(region, None, [], "measured", passed_over, None, comparison, reports,
                         errors, rejected)
    fresh = [RankedCandidate(n, comparison.stats[n]) for n in comparison.ranking]
    ranking = _merged_ranking(fresh, entry, [*errors, *rejected])
    gone = {**(dict(entry.rejected) if entry is not None else {}), **rejected,
            **{n: f"error: {why}" for n, why in errors.items()}}
    for name in comparison.ranking:
        gone.pop(name, None)
    new_entry = CacheEntry(device.tag, target, the_op.name, key[3], region.dtype,
                           ranking, comparison.confidence, comparison.tie, gone,
                           _provenance(device, inputs, comparison))
    cache.put(new_entry)
    order = [by_name[n] for n in comparison.ranking if by_name[n] in survivors]
    return Selection(region, order[0] if order else None, order, "measured", passed_over,
                     new_entry, comparison, reports, errors, rejected)


def _by_rank(entry: CacheEntry, pool: Sequence[Candidate]) -> list[Candidate]:
    """``pool`` in the entry's ranking order; candidates not ranked follow by tier."""
    rank = {r.name: i for i, r in enumerate(entry.ranking)}
    last = len(rank)
    return sorted(pool, key=lambda c: (rank.get(c.name, last), -c.tier, c.name))


@dataclass(eq=False)
class _Step:
    """One candidate of a plan, in order, with its counters and whether it is gated."""

    cand: Candidate
    accepts: Callable[..., bool] | None  # None: it accepts everything
    run: Callable[..., Any]
    won: Callable[[], int]
    gated: bool


@dataclass(eq=False)
class _KeyPlan:
    """The order of one dispatch key in one mode: steps, and what each dispatch charges.

    ``charges`` are the counters of candidates passed over on every dispatch of the
    key (failed the gate, raised in the gate or in ``available()``).
    """

    op: Op
    key: DispatchKey
    mode: str
    steps: tuple[_Step, ...]
    charges: tuple[Callable[[], int], ...]
    no_candidate: str  # why nothing could run, when there are no steps
    stamp: tuple[int, int, int]


class _Plan:
    """The memoised dispatch of one input signature: a key plan plus its fast step.

    ``run`` is ``None`` when the signature must take the slow path every time
    (charges to record, or no candidate that ran its first inputs). ``pre``: the
    ``accepts`` of higher steps that declined the first inputs; inputs of the same
    signature that one of them accepts (other strides, say) take the slow path, so
    every input gets the same candidate whatever came first.
    """

    __slots__ = ("accepts", "cache_version", "generation", "keyplan", "pre", "run", "start",
                 "won")

    def __init__(self, keyplan: _KeyPlan, start: int, pre: tuple[Callable[..., bool], ...],
                 generation: int, cache_version: int) -> None:
        self.keyplan = keyplan
        self.start = start
        self.pre = pre or None
        self.generation = generation
        self.cache_version = cache_version
        fast = keyplan.steps[start] if 0 <= start < len(keyplan.steps) else None
        if fast is None or keyplan.charges or not fast.gated:
            self.accepts: Callable[..., bool] | None = None
            self.run: Callable[..., Any] | None = None
            self.won: Callable[[], int] | None = None
        else:
            self.accepts, self.run, self.won = fast.accepts, fast.run, fast.won


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


@dataclass(eq=False)
class _Verdict:
    """The gate's memoised verdict on one candidate for one key.

    ``decline``: it declined every gate input, so nothing was checked; it is not run
    for the key (a decline), and not gated again.
    """

    cand: Candidate
    kind: str  # "pass", "reject", "error", "decline"
    reason: str


def _default_accepts(cand: Candidate) -> Callable[..., bool] | None:
    """``None`` when ``cand`` keeps the base class's accept-everything ``accepts``."""
    method = cand.accepts
    if getattr(method, "__func__", None) is Candidate.accepts:
        return None
    return method


class Arbiter:
    """Dispatches ops to candidates and records every dispatch in a histogram.

    ``mode``: ``tune`` measures at the first cache miss; ``static`` uses the tier order
    on a miss; ``strict`` makes a miss an error (CI replay of a committed cache).
    ``gate``: F4-gate every candidate for a dispatch key before it first runs for it
    (on in every pytest run; off by default in production, where the corpus entries
    were gated when they were measured). ``call_timeout_s``: the per-call watchdog of
    gate and timing calls.
    """

    def __init__(self, *, registry: CandidateRegistry | None = None,
                 ops: OpRegistry | None = None, cache: MeasureCache | None = None,
                 histogram: DispatchHistogram | None = None, mode: str = "tune",
                 policy: ComparePolicy | None = None, gate_seed: int = GATE_SEED,
                 gate: bool = True, call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S,
                 ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown arbiter mode {mode!r}; modes are {', '.join(MODES)}")
        self.registry = registry if registry is not None else REGISTRY
        self.ops = ops if ops is not None else OPS
        self.cache = cache if cache is not None else MeasureCache()
        self.histogram = histogram if histogram is not None else DispatchHistogram()
        self.mode = mode
        self.policy = policy
        self.gate_seed = gate_seed
        self.gate_enabled = gate
        self.call_timeout_s = call_timeout_s
        self.events: dict[DispatchKey, DispatchEvent] = {}
        self.reasons: dict[HistogramKey, str] = {}
        """Why each degraded, rejected, error and no_candidate entry happened (the first
        reason seen): the decline's reason, the gate's report line, the exception."""
        self._verdicts: dict[tuple[DispatchKey, str], _Verdict] = {}
        self._keyplans: dict[tuple[str, DispatchKey], _KeyPlan] = {}
        self._plans: dict[Any, _Plan] = {}
        self._older: dict[Any, _Plan] = {}
        self._mode_plans: dict[str, tuple[dict[Any, _Plan], dict[Any, _Plan]]] = {}
        self._epoch = 0
        self._lock = threading.RLock()

    # -- the hot path ---------------------------------------------------------------

    def dispatch(self, op: str, *inputs: Any, target: str | None = None) -> Any:
        """Run ``op`` on ``inputs`` with the arbitrated candidate and record the outcome."""
        try:
            if len(inputs) == 1:
                x = inputs[0]
                sig: Any = (op, target, x.__class__, x.shape, x.dtype)
            elif len(inputs) == 2:
                a, b = inputs
                sig = (op, target, a.__class__, a.shape, a.dtype, b.__class__, b.shape, b.dtype)
            else:
                sig = (op, target, *[(x.__class__, x.shape, x.dtype) for x in inputs])
            plan = self._plans.get(sig)
        except (AttributeError, TypeError):
            sig, plan = None, None
        if (plan is None or plan.generation != self.registry.generation
                or plan.cache_version != self.cache.version):
            plan = self._find_plan(self.mode, op, inputs, target, sig)
        run = plan.run
        if run is not None:
            accepts = plan.accepts
            try:
                if plan.pre is not None and any(pre(*inputs) for pre in plan.pre):
                    return self._run_slow(plan.keyplan, inputs, -1, None)
                if accepts is None or accepts(*inputs):
                    out = run(*inputs)
                    plan.won()  # type: ignore[misc]
                    return out
            except Exception as exc:
                return self._run_slow(plan.keyplan, inputs, plan.start, exc)
            return self._run_slow(plan.keyplan, inputs, plan.start, False)
        return self._run_slow(plan.keyplan, inputs, plan.start, None)

    def dispatch_as(self, mode: str, op: str, *inputs: Any, target: str | None = None) -> Any:
        """:meth:`dispatch` in another mode, on this arbiter's cache, gate and histogram."""
        if mode == self.mode:
            return self.dispatch(op, *inputs, target=target)
        if mode not in MODES:
            raise ValueError(f"unknown arbiter mode {mode!r}; modes are {', '.join(MODES)}")
        try:
            sig: Any = (op, target, *[(x.__class__, x.shape, x.dtype) for x in inputs])
            young, old = self._tables(mode)
            plan = young.get(sig) or old.get(sig)
        except (AttributeError, TypeError):
            sig, plan = None, None
        if (plan is None or plan.generation != self.registry.generation
                or plan.cache_version != self.cache.version):
            plan = self._find_plan(mode, op, inputs, target, sig)
        return self._run_slow(plan.keyplan, inputs, -1, None)

    # -- the slow path --------------------------------------------------------------

    def _record(self, key: HistogramKey, reason: str) -> None:
        self.histogram.add(key)
        if key not in self.reasons:
            self.reasons[key] = reason

    def _run_slow(self, kp: _KeyPlan, inputs: Sequence[Any], start: int,
                  first: BaseException | bool | None) -> Any:
        """Every dispatch but the fast step's success: charges, declines, errors, the
        gate of a step not yet gated, and the reference when nothing could run.

        ``first``: what the fast step ``start`` already did (raised, or ``False``:
        declined through ``accepts``); ``None``: nothing ran yet.
        """
        target, op_name = kp.key[0], kp.key[1]
        for charge in kp.charges:
            charge()
        declined: tuple[str, str] | None = None
        ran_any = False
        for index, step in enumerate(kp.steps):
            name = step.cand.name
            if index == start and first is not None:
                ran_any = True
                if first is False:
                    declined = declined or (name, "declined the inputs (accepts() returned "
                                                  "False)")
                elif isinstance(first, Decline):
                    declined = declined or (name, first.reason)
                else:
                    self._record((target, op_name, name, "error"),
                                 _exc_text(first))  # type: ignore[arg-type]
                continue
            try:
                if step.accepts is not None and not step.accepts(*inputs):
                    declined = declined or (name, "declined the inputs (accepts() returned "
                                                  "False)")
                    continue
            except Decline as dec:
                declined = declined or (name, dec.reason)
                continue
            except Exception as exc:
                self._record((target, op_name, name, "error"), f"accepts() raised "
                             f"{_exc_text(exc)}")
                continue
            if not step.gated:
                verdict, reason = self._gate_for(kp, step.cand, inputs)
                if verdict == "decline":
                    declined = declined or (name, reason)
                    continue
                if verdict != "pass":
                    outcome = "rejected" if verdict == "reject" else "error"
                    self._record((target, op_name, name, outcome), reason)
                    continue
            ran_any = True
            try:
                out = step.run(*inputs)
            except Decline as dec:
                declined = declined or (name, dec.reason)
                continue
            except Exception as exc:
                self._record((target, op_name, name, "error"), _exc_text(exc))
                continue
            step.won()
            return out
        if declined is not None:
            self._record((target, op_name, declined[0], "degraded"), declined[1])
        elif not kp.charges and not ran_any:
            self._record((target, op_name, NO_CANDIDATE, "no_candidate"), kp.no_candidate)
        return kp.op.run_reference(*inputs)

    # -- planning -------------------------------------------------------------------

    def _tables(self, mode: str) -> tuple[dict[Any, _Plan], dict[Any, _Plan]]:
        if mode == self.mode:
            return self._plans, self._older
        found = self._mode_plans.get(mode)
        if found is None:
            found = self._mode_plans.setdefault(mode, ({}, {}))
        return found

    def _find_plan(self, mode: str, op_name: str, inputs: Sequence[Any], target: str | None,
                   sig: Any) -> _Plan:
        old = self._tables(mode)[1]
        if sig is not None:
            found = old.get(sig)
            if (found is not None and found.generation == self.registry.generation
                    and found.cache_version == self.cache.version):
                self._remember(mode, sig, found)  # used again: it survives the rotation
                return found
        plan = self._plan(mode, op_name, inputs, target)
        if sig is not None:
            self._remember(mode, sig, plan)
        return plan

    def _remember(self, mode: str, sig: Any, plan: _Plan) -> None:
        # two generations: a plan used since the last rotation survives it, so the cost
        # stays flat however many signatures a workload cycles through
        with self._lock:
            young, old = self._tables(mode)
            if len(young) >= MAX_PLANS:
                old.clear()
                old.update(young)
                young.clear()
            young[sig] = plan

    def _forget_plans(self) -> None:
        """Drop every memoised plan (a verdict changed what some key may run)."""
        with self._lock:
            self._epoch += 1
            self._plans.clear()
            self._older.clear()
            for young, old in self._mode_plans.values():
                young.clear()
                old.clear()
            self._keyplans.clear()

    def _plan(self, mode: str, op_name: str, inputs: Sequence[Any], target: str | None
              ) -> _Plan:
        the_op = self.ops.get(op_name)
        the_op.validate(*inputs)
        resolved = target if target is not None else (
            target_of_array(inputs[0]) if inputs else "cpu")
        with self._lock:
            generation = self.registry.generation
            region = the_op.region_of(*inputs)
            needs = self.registry.alignment_needs(the_op.name, resolved)
            key: DispatchKey = (resolved, the_op.name, region.bucket(needs), region.dtype)
            kp = self._keyplans.get((mode, key))
            if kp is None or kp.stamp != (generation, self.cache.version, self._epoch):
                kp = self._keyplan(mode, the_op, region, needs, key, inputs)
            start, pre = self._fast_start(kp, inputs)
            kp = self._keyplans.get((mode, key), kp)  # gating may have rebuilt it
            return _Plan(kp, start, pre, generation, self.cache.version)

    def _fast_start(self, kp: _KeyPlan, inputs: Sequence[Any]
                    ) -> tuple[int, tuple[Callable[..., bool], ...]]:
        """The step that serves these inputs (gated now if it was not; -1 for none),
        and the ``accepts`` of the steps above it that declined them."""
        while True:
            pre: list[Callable[..., bool]] = []
            for index, step in enumerate(kp.steps):
                try:
                    if step.accepts is not None and not step.accepts(*inputs):
                        pre.append(step.accepts)
                        continue
                except Exception:
                    return -1, ()  # recorded on each dispatch, by the slow path
                if step.gated:
                    return index, tuple(pre)
                verdict, _ = self._gate_for(kp, step.cand, inputs)
                if verdict == "pass":
                    return index, tuple(pre)
                memo = self._verdicts.get((kp.key, step.cand.name))
                if verdict == "decline" and memo is not None and memo.kind == "pass":
                    # right for the key but raised Decline on these inputs: it stays the
                    # fast step (inputs of this signature it can run must reach it)
                    return index, tuple(pre)
                if verdict in ("reject", "error"):
                    # the key plan was dropped with the verdict: build it again
                    kp = self._rebuilt(kp, inputs)
                    break
            else:
                return -1, ()

    def _rebuilt(self, kp: _KeyPlan, inputs: Sequence[Any]) -> _KeyPlan:
        region = kp.op.region_of(*inputs)
        needs = self.registry.alignment_needs(kp.op.name, kp.key[0])
        return self._keyplan(kp.mode, kp.op, region, needs, kp.key, inputs)

    def _gate_for(self, kp: _KeyPlan, cand: Candidate, inputs: Sequence[Any]
                  ) -> tuple[str, str]:
        """The gate's verdict on ``cand`` for ``kp``'s key, memoised per process."""
        memo_key = (kp.key, cand.name)
        found = self._verdicts.get(memo_key)
        if found is not None and found.cand is cand:
            return found.kind, found.reason
        report = self._gate_report(kp.op, cand, inputs)
        kind, reason = _gate_verdict(report)
        with self._lock:
            memo_kind = "pass" if kind == "decline-inputs" else kind
            self._verdicts[memo_key] = _Verdict(cand, memo_kind, reason)
            if kind in ("reject", "error"):
                self._forget_plans()
            elif memo_kind == "pass":
                for other in list(self._keyplans.values()):
                    if other.key == kp.key:
                        for step in other.steps:
                            if step.cand is cand:
                                step.gated = True
        if kind == "decline-inputs":
            # right for the key, but not these inputs: a decline of this dispatch
            return "decline", reason
        return kind, reason

    def _gate_report(self, the_op: Op, cand: Candidate, inputs: Sequence[Any]) -> GateReport:
        region = the_op.region_of(*inputs)
        return f4_gate(cand, the_op, inputs=inputs, region=region, seed=self.gate_seed,
                       call_timeout_s=self.call_timeout_s)

    def _policy(self) -> ComparePolicy:
        policy = self.policy or ComparePolicy()
        if self.call_timeout_s is not None and policy.call_timeout_s is None:
            policy = replace(policy, call_timeout_s=self.call_timeout_s)
        return policy

    def _keyplan(self, mode: str, the_op: Op, region: Region, needs: tuple[int, ...],
                 key: DispatchKey, inputs: Sequence[Any]) -> _KeyPlan:
        target = key[0]
        pool = self.registry.for_op(the_op.name, target)
        passed_over: dict[str, str] = {}
        errors: dict[str, str] = {}
        rejected: dict[str, str] = {}
        found = probe_device(target)
        selection: Selection | None = None
        entry: CacheEntry | None = None
        if not isinstance(found, DeviceInfo):
            for cand in pool:
                passed_over[cand.name] = f"unavailable: {found}"
            order: list[Candidate] = []
            source = "static"
        else:
            ckey: CacheKey = (found.tag, target, the_op.name, key[2], key[3])
            if mode == "tune":
                selection = measured_arbitrate(
                    the_op, inputs, pool, self.cache, target=target, policy=self._policy(),
                    gate_seed=self.gate_seed, needs=needs,
                    gate=(lambda c: self._gate_memo(key, the_op, c, inputs))
                    if self.gate_enabled else None)
                errors.update(selection.errors)
                rejected.update(selection.rejected)
                passed_over.update(selection.passed_over)
            entry = self.cache.get(ckey)
            if entry is not None:
                order = _by_rank(entry, pool)
                source = selection.source if selection is not None else "cached"
                if not self.gate_enabled:
                    order = [c for c in order if c.name not in entry.rejected]
                    for name, why in entry.rejected.items():
                        passed_over.setdefault(name, f"passed over when measured: {why}")
            else:
                order = list(pool)
                source = selection.source if selection is not None else "static"
                if mode == "strict":
                    screened = _screen(region, pool, inputs, {}, errors={})
                    if screened:
                        raise CacheMiss(
                            f"strict mode: no cached winner for {region.describe()} on target "
                            f"{target!r} (device {found.tag}, bucket {key[2]}); tune with "
                            "--arbiter-tune or add the entry to the cache")
        steps: list[_Step] = []
        charges: list[Callable[[], int]] = []
        for cand in order:
            if not _usable(cand, region, passed_over, errors):
                continue
            if cand.name not in passed_over:
                _accepts(cand, inputs, passed_over, None)  # the explain text, no more
            verdict = self._verdicts.get((key, cand.name)) if self.gate_enabled else None
            if verdict is not None and verdict.cand is not cand:
                verdict = None
            if verdict is not None and verdict.kind in ("reject", "error"):
                (rejected if verdict.kind == "reject" else errors)[cand.name] = verdict.reason
                continue
            if cand.name in errors or cand.name in rejected:
                continue
            gated = not self.gate_enabled or (verdict is not None and verdict.kind == "pass")
            won = self.histogram.counter((target, the_op.name, cand.name, "won"))
            steps.append(_Step(cand, _default_accepts(cand), cand.run, won, gated))
        for name, reason in sorted(rejected.items()):
            hkey: HistogramKey = (target, the_op.name, name, "rejected")
            self.reasons.setdefault(hkey, reason)
            charges.append(self.histogram.counter(hkey))
        for name, reason in sorted(errors.items()):
            if name in rejected:
                continue
            hkey = (target, the_op.name, name, "error")
            self.reasons.setdefault(hkey, reason)
            charges.append(self.histogram.counter(hkey))
        if not isinstance(found, DeviceInfo):
            why = f"no {target} device: {found}"
        elif not pool:
            why = f"no candidate of {the_op.name!r} is registered for target {target!r}"
        else:
            why = "; ".join(f"{n}: {r}" for n, r in sorted(passed_over.items())) or (
                "no candidate applies")
        kp = _KeyPlan(the_op, key, mode, tuple(steps), tuple(charges), why,
                      (self.registry.generation, self.cache.version, self._epoch))
        self._keyplans[(mode, key)] = kp
        why_not = {**passed_over, **rejected, **errors}
        self._note(key, source, [s.cand.name for s in steps if s.cand.name not in why_not],
                   why_not, selection, entry)
        return kp

    def _gate_memo(self, key: DispatchKey, the_op: Op, cand: Candidate,
                   inputs: Sequence[Any]) -> GateReport:
        """The measurement's gate call: a report, with its verdict memoised."""
        report = self._gate_report(the_op, cand, inputs)
        kind, reason = _gate_verdict(report)
        self._verdicts[(key, cand.name)] = _Verdict(
            cand, "pass" if kind == "decline-inputs" else kind, reason)
        return report

    def _note(self, key: DispatchKey, source: str, order: list[str],
              passed_over: dict[str, str], selection: Selection | None,
              entry: CacheEntry | None) -> None:
        previous = self.events.get(key)
        if previous is not None and previous.source == "measured":
            source = "measured"
        comparison = selection.comparison if selection is not None else None
        ratios: dict[str, float] = {}
        if comparison is not None:
            ratios = dict(comparison.ratios)
        elif entry is not None and entry.ranking:
            best = entry.ranking[0].stats.median_ns
            ratios = {r.name: r.stats.median_ns / best for r in entry.ranking if best > 0}
        self.events[key] = DispatchEvent(
            key[0], key[1], key[2], key[3], source, order, dict(passed_over), ratios,
            entry.tie if entry else False, entry.confidence if entry else 1.0)

    # -- reasons, for tests and the summary -----------------------------------------

    def _reasons_of(self, outcome: str) -> dict[tuple[str, str, str], str]:
        return {(k[0], k[1], k[2]): v for k, v in self.reasons.items() if k[3] == outcome}

    @property
    def declines(self) -> dict[tuple[str, str, str], str]:
        """(target, op, candidate) -> the reason of its first recorded degrade."""
        return self._reasons_of("degraded")

    @property
    def errors(self) -> dict[tuple[str, str, str], str]:
        """(target, op, candidate) -> its first recorded exception."""
        return self._reasons_of("error")

    # -- explicit gate --------------------------------------------------------------

    def gate(self, candidate_name: str, *inputs: Any, seed: int | None = None) -> GateReport:
        """F4-gate one registered candidate on ``inputs`` (and the op's generated inputs)."""
        cand = self.registry.get(candidate_name)
        the_op = self.ops.get(cand.op)
        return f4_gate(cand, the_op, inputs=inputs, seed=self.gate_seed if seed is None else seed,
                       call_timeout_s=self.call_timeout_s)

    def gate_region(self, candidate_name: str, region: Region,
                    seed: int | None = None) -> GateReport:
        cand = self.registry.get(candidate_name)
        return f4_gate(cand, self.ops.get(cand.op), region=region,
                       seed=self.gate_seed if seed is None else seed,
                       call_timeout_s=self.call_timeout_s)
