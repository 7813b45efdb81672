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
import functools
import platform
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple, TypeGuard

import numpy as np

from pytest_arbiter import hooks
from pytest_arbiter.backends import BACKENDS
from pytest_arbiter.cache import (
    CacheEntry,
    CacheKey,
    Considered,
    MeasureCache,
    RankedCandidate,
    since_for,
    utc_now,
)
from pytest_arbiter.candidates import (
    REGISTRY,
    Candidate,
    CandidateRegistry,
    Decline,
    known_targets,
)
from pytest_arbiter.device import DeviceInfo, probe_device, target_of_array
from pytest_arbiter.device_lock import measurement_lock
from pytest_arbiter.fingerprint import current_environment, fingerprint_of
from pytest_arbiter.freshness import (
    DECLINED_BY_ACCEPTS,
    DECLINED_ON_INPUTS,
    freshness,
    vouched,
)
from pytest_arbiter.gate import GATE_SEED, GateReport, f4_gate
from pytest_arbiter.histogram import NO_CANDIDATE, DispatchHistogram, HistogramKey, Outcome
from pytest_arbiter.measure import CPU_TIMER, ComparePolicy, Comparison, Timer, compare_latencies
from pytest_arbiter.ops import OPS, Op, OpRegistry
from pytest_arbiter.recheck import RecheckPolicy, RecheckResult, RunBudget, recheck
from pytest_arbiter.regions import Region

Mode = Literal["tune", "static", "strict"]
"""How a dispatch picks: measure at a miss, the cache or tier order, the cache only
(SPEC.md, "Arbiter")."""
MODES: tuple[Mode, ...] = ("tune", "static", "strict")


Source = Literal["measured", "cached", "static"]
"""Where a pick came from: timed now, the cache, or the static tier order."""


def is_mode(value: object) -> TypeGuard[Mode]:
    return value in MODES

MAX_PLANS = 1 << 17
"""Memoised dispatch plans (one per input signature) per generation; two generations
are kept, so up to twice this many signatures dispatch without re-planning."""
DEFAULT_CALL_TIMEOUT_S = 60.0
"""The per-call watchdog's default: a gate or timing call this long is a hang."""

class DispatchKey(NamedTuple):
    """What one memoised pick serves."""

    target: str
    op: str
    bucket: str
    dtype: str


def register_timer(target: str, make_timer: Callable[[], Timer]) -> None:
    """Set the timer used to measure ``target``'s candidates, over its backend's (the
    older way; :meth:`pytest_arbiter.Backend.timer` is the current one)."""
    BACKENDS.timer_overrides[target] = make_timer


def timer_for(target: str) -> Timer:
    """``target``'s timer: its backend's (CUDA events on the GPU lanes), else the CPU clock."""
    make = BACKENDS.timer_overrides.get(target)
    if make is not None:
        return make()
    hooks.load_backends()
    backend = BACKENDS.for_target(target)
    return (backend.timer(target) if backend is not None else None) or CPU_TIMER


class CacheMiss(LookupError):
    """Strict mode: a dispatch key has no cached winner."""


class StaleEntry(CacheMiss):
    """Strict mode: a dispatch key's cached entry is out of date: its winner's code
    changed, or a candidate that can run the key was never measured for it."""


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
    source: Source
    passed_over: dict[str, str] = field(default_factory=dict)
    entry: CacheEntry | None = None
    comparison: Comparison | None = None
    gate_reports: dict[str, GateReport] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    found: dict[str, tuple[Outcome, str]] = field(default_factory=dict)
    """What this measurement found wrong: name -> (outcome, reason), for the candidates
    it gated and timed (``rejected``, or ``error`` in the gate, staging or timing)."""


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
                comparison: Comparison, timed_alone: bool) -> dict[str, Any]:
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
        "timed_alone": timed_alone,
    }


def _merged_ranking(fresh: list[RankedCandidate], old: CacheEntry | None,
                    drop: Iterable[str]) -> tuple[RankedCandidate, ...]:
    """The fresh ranking, with the old entry's other rows slotted in.

    Old rows come from another comparison (another run, maybe another shape of the
    bucket): they are placed by their median scaled by how a candidate timed in both
    comparisons moved (the first fresh row the old ranking has), so only candidates timed
    side by side decide their order; with no such candidate they follow the fresh rows.
    The stats written are the old rows' own.
    """
    if old is None:
        return tuple(fresh)
    skip = {r.name for r in fresh} | set(drop)
    old_ns = {r.name: r.stats.median_ns for r in old.ranking}
    common = next((r for r in fresh if old_ns.get(r.name, 0) > 0 and r.stats.median_ns > 0),
                  None)
    scale = common.stats.median_ns / old_ns[common.name] if common is not None else None
    merged = list(fresh)
    placed = [r.stats.median_ns for r in fresh]
    for row in old.ranking:
        if row.name in skip:
            continue
        ns = row.stats.median_ns * scale if scale is not None else 0.0
        if ns <= 0:  # nothing to place it by: after every row timed now
            at, ns = len(merged), float("inf")
        else:
            at = next((i for i, t in enumerate(placed) if t > ns), len(merged))
        merged.insert(at, row)
        placed.insert(at, ns)
    return tuple(merged)


VerdictFn = Callable[[Candidate], tuple[str, str]]
"""A candidate's gate verdict ``(kind, reason)``, as :func:`_gate_verdict` gives it."""


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
                       needs: tuple[int, ...] = (), verdict: VerdictFn | None = None,
                       supersede: bool = False) -> Selection:
    """Gate the candidates, time the survivors interleaved, cache and return the fastest.

    A cache hit times nothing; its winner is re-checked with ``accepts(inputs)`` and,
    if it cannot run them, the next-fastest cached candidate that can is used. The key
    is measured again when no cached candidate can run the inputs, or when a candidate
    that can run them was never measured for it (it joins the ranking). ``verdict``
    replaces the plain F4 gate call (the arbiter passes its per-process memo).
    ``supersede``: the new entry replaces the cached one in any merge, whatever their
    evidence (a recheck found the cached winner slower: the re-measurement is the truth).
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
    key = CacheKey(device.tag, target, the_op.name, region.bucket(needs), region.dtype)
    entry = cache.get(key)
    errors: dict[str, str] = {}
    applicable = _screen(region, pool, None, passed_over, errors=errors)
    usable = [c for c in applicable if _accepts(c, inputs, passed_over, errors)]
    environment = current_environment(target)
    subset: set[str] | None = None  # None: time every usable candidate
    stale: set[str] = set()
    if entry is not None and not remeasure:
        now = freshness(entry, applicable, environment, [c.name for c in usable],
                        retry_declined=True)
        ranked = {r.name for r in entry.ranking}
        cached = [c for c in _by_rank(entry, usable) if c.name in ranked]
        if cached and now.current:
            return _cached_selection(region, entry, cached, passed_over, errors)
        if cached and entry.considered and not now.winner_changed:
            # time what is new or changed against the cached leader (and, in a new
            # environment, re-time the leader against the runner-up); the other rows of
            # the ranking stand
            subset = {cached[0].name, *now.to_measure}
            if now.environment and len(cached) > 1:
                subset.add(cached[1].name)
        stale = set(now.changed)
    measuring = usable if subset is None else [c for c in usable if c.name in subset]
    reports: dict[str, GateReport] = {}
    rejected: dict[str, str] = {}
    findings: dict[str, tuple[Outcome, str]] = {  # from the screen
        name: ("error", why) for name, why in errors.items()}
    survivors = []
    declined_these: list[Candidate] = []

    def gate(cand: Candidate) -> None:
        if verdict is not None:
            kind, reason = verdict(cand)
        else:
            report = f4_gate(cand, the_op, inputs=inputs, region=region, seed=gate_seed)
            reports[cand.name] = report
            kind, reason = _gate_verdict(report)
        if kind == "pass":
            survivors.append(cand)
            return
        if kind == "decline-inputs":
            declined_these.append(cand)
        passed_over[cand.name] = {"decline": f"declined: {reason}",
                                  "decline-inputs": f"declined the inputs: {reason}"
                                  }.get(kind, reason)
        if kind == "reject":
            rejected[cand.name] = reason
            findings[cand.name] = ("rejected", reason)
        elif kind == "error":
            errors[cand.name] = reason
            findings[cand.name] = ("error", reason)

    for cand in measuring:
        gate(cand)
    if subset is not None and not any(c.name in ranked for c in survivors):
        # the cached leader cannot run these inputs: time the new rows against the next
        # cached candidate that can, so they are still placed by a side-by-side comparison
        for cand in cached[1:]:
            if cand.name not in subset:
                subset.add(cand.name)
                measuring.append(cand)
                gate(cand)
                if survivors and survivors[-1] is cand:
                    break
    if not survivors:
        return Selection(region, None, [], "measured", passed_over, gate_reports=reports,
                         errors=errors, rejected=rejected, found=findings)
    if (entry is not None and subset is not None and not now.changed and not now.environment
            and all(_declined_on_inputs(entry, name) for name in now.unmeasured)
            and not rejected and not any(c.name in errors for c in measuring)
            and not any(c.name in now.unmeasured for c in survivors)):
        # to measure were only candidates that declined the inputs they were tried on,
        # and they declined these too: the entry stands (no write, no plan dropped)
        return _cached_selection(region, entry, cached, passed_over, errors)
    timed, timed_inputs = survivors, inputs
    if declined_these and the_op.gate_inputs is not None:
        # a candidate right for the key declined these inputs (their layout, say): time
        # every one of them on the key's own generated input, so the ranking holds all
        # the key's candidates whichever input came first
        own = the_op.gate_inputs(region, gate_seed)[0]
        if [np.shape(x) for x in own] == [np.shape(x) for x in inputs]:
            timed_inputs = own
            timed = [c for c in measuring if c in survivors or c in declined_these
                     if _accepts(c, own, {}, None)]
    fns = {}
    for cand in timed:
        try:
            prepared = cand.prepare_inputs(*timed_inputs)
        except Exception as exc:
            errors[cand.name] = f"while staging its inputs: {_exc_text(exc)}"
            passed_over[cand.name] = errors[cand.name]
            findings[cand.name] = ("error", errors[cand.name])
            continue
        fns[cand.name] = (lambda c=cand, args=prepared: c.run(*args))
    timed = [c for c in timed if c.name in fns]
    if not fns:
        return Selection(region, None, [], "measured", passed_over, gate_reports=reports,
                         errors=errors, rejected=rejected, found=findings)
    with measurement_lock(device.tag) as alone:
        comparison = compare_latencies(fns, tiers={c.name: c.tier for c in timed},
                                       policy=policy, timer=timer or timer_for(target))
    for name, why in comparison.failed.items():
        if why.startswith(f"{Decline.__name__}: "):
            passed_over[name] = f"declined while timed: {why.split(': ', 1)[1]}"
            continue
        errors[name] = f"while timed: {why}"
        passed_over[name] = f"raised while timed: {why}"
        findings[name] = ("error", errors[name])
    for name, why in comparison.dropped.items():
        passed_over[name] = why
    by_name = {c.name: c for c in timed}
    if not comparison.ranking:
        return Selection(region, None, [], "measured", passed_over, None, comparison, reports,
                         errors, rejected, findings)
    fresh = [RankedCandidate(n, comparison.stats[n]) for n in comparison.ranking]
    failed = {*errors, *rejected}
    ranking = _merged_ranking(fresh, entry, [*failed, *stale])
    gone = {**({n: why for n, why in entry.rejected.items() if n not in stale}
               if entry is not None else {}),
            **rejected, **{n: f"error: {why}" for n, why in errors.items()}}
    for name in comparison.ranking:
        gone.pop(name, None)
    considered = _considered(applicable, {c.name for c in usable}, entry, subset,
                             set(comparison.ranking), rejected, errors, passed_over,
                             own_inputs_only=the_op.gate_inputs is None)
    new_entry = CacheEntry(device.tag, target, the_op.name, key.bucket, region.dtype,
                           ranking, comparison.confidence, comparison.tie, gone,
                           _provenance(device, inputs, comparison, alone), considered,
                           environment, False,
                           since_for(entry, considered, environment, utc_now(),
                                     supersede=supersede))
    cache.put(new_entry)
    hooks.call("pytest_arbiter_candidate_measured", entry=new_entry)
    can_run = {c.name: c for c in usable}
    order = [can_run[r.name] for r in ranking if r.name in can_run and r.name not in failed
             and (can_run[r.name] in survivors or r.name not in by_name)]
    return Selection(region, order[0] if order else None, order, "measured", passed_over,
                     new_entry, comparison, reports, errors, rejected, findings)


def _cached_selection(region: Region, entry: CacheEntry, cached: list[Candidate],
                      passed_over: dict[str, str], errors: dict[str, str]) -> Selection:
    """The pick the cache already holds, with the reasons of the kernels it passed over."""
    for name, why in entry.rejected.items():
        passed_over.setdefault(name, why)
    return Selection(region, cached[0], cached, "cached", passed_over, entry, errors=errors)


def _declined_on_inputs(entry: CacheEntry, name: str) -> bool:
    seen = entry.considered.get(name)
    return (seen is not None and seen.outcome == "declined"
            and seen.reason.startswith(DECLINED_ON_INPUTS))


def _considered(applicable: Sequence[Candidate], accepting: set[str], old: CacheEntry | None,
                subset: set[str] | None, timed: set[str], rejected: Mapping[str, str],
                errors: Mapping[str, str], passed_over: Mapping[str, str],
                *, own_inputs_only: bool = False) -> dict[str, Considered]:
    """What became of every candidate considered for the key, with its code's
    fingerprint. A row is ``timed`` only for a candidate timed in this comparison, or
    kept from ``old`` with the same fingerprint; rows of candidates that do not apply
    here (another runner's) are carried as they were."""
    out: dict[str, Considered] = {}
    if old is not None:
        here = {c.name for c in applicable}
        out.update((name, row) for name, row in old.considered.items() if name not in here)
    for cand in applicable:
        name = cand.name
        code = fingerprint_of(cand)
        kept = old.considered.get(name) if old is not None else None
        if name in rejected:
            out[name] = Considered(code, "rejected", rejected[name])
        elif name in errors:
            out[name] = Considered(code, "error", errors[name])
        elif name in timed:
            out[name] = Considered(code, "timed")
        elif kept is not None and kept.fingerprint == code and (
                subset is not None or kept.outcome == "timed"):
            out[name] = kept  # not re-measured: what it was measured as stands
        elif name not in accepting:
            out[name] = Considered(code, "declined", DECLINED_BY_ACCEPTS + passed_over.get(
                name, "declined").removeprefix("declined the inputs").lstrip(": "))
        elif own_inputs_only and passed_over.get(name, "").startswith("declined: "):
            # declined in the gate, on the only inputs there were to try: tried again
            # on a later tuning dispatch's inputs
            out[name] = Considered(code, "declined", DECLINED_ON_INPUTS + passed_over[
                name].removeprefix("declined: "))
        else:  # it declined in the gate or while timed
            out[name] = Considered(code, "declined",
                                   passed_over.get(name, "not timed for these inputs"))
    return out


def _by_rank(entry: CacheEntry, pool: Sequence[Candidate]) -> list[Candidate]:
    """``pool`` in the entry's ranking order; candidates not ranked follow by tier."""
    rank = {r.name: i for i, r in enumerate(entry.ranking)}
    last = len(rank)
    return sorted(pool, key=lambda c: (rank.get(c.name, last), -c.tier, c.name))


@dataclass(eq=False)
class _Step:
    """One candidate of a key's order, with its counters.

    ``blocked``: the histogram key and reason of a candidate whose ``available()``
    raised: it never runs for the key, and every dispatch that reaches it (one it
    would have served) records the error. (A gate failure blocks a candidate for one
    layout of the inputs: see ``Arbiter._gate_for``.)
    """

    cand: Candidate
    accepts: Callable[..., bool] | None  # None: it accepts everything
    run: Callable[..., Any]
    won: Callable[[], int]
    blocked: tuple[HistogramKey, str] | None = None
    vouched: bool = False
    """The key's cache entry vouches for its current code (gated and timed with it): a
    run with the gate off runs it ungated; anything else is gated first in every mode."""


@dataclass(eq=False)
class _KeyPlan:
    """The order of one dispatch key in one mode."""

    op: Op
    key: DispatchKey
    mode: Mode
    steps: tuple[_Step, ...]
    no_candidate: str  # why nothing could run, when there are no steps
    stamp: tuple[int, int]
    fresh: dict[str, tuple[Outcome, str]] = field(default_factory=dict)
    """What the measurement that built this plan found wrong (name -> outcome, reason):
    the dispatch that measured reached those candidates, and records them once."""
    retry: bool = False
    """Tuning, the key's entry has a candidate that declined the only inputs it was
    tried on (:data:`~pytest_arbiter.freshness.DECLINED_ON_INPUTS`): each new input
    signature plans the key again, so the measurement tries it on those inputs."""


class _Plan:
    """The memoised dispatch of one input signature: a key plan plus its fast step.

    ``run`` is ``None`` when the signature must take the slow path every time (a
    candidate above to charge, one not gated yet, or none that ran its first inputs).
    ``pre``: the ``accepts`` of higher steps that declined the first inputs; inputs of
    the same signature that one of them accepts take the slow path, so every input gets
    the same candidate and outcome whatever came first.
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
        if fast is None or fast.blocked is not None:
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
    source: Source
    order: list[str]
    passed_over: dict[str, str]
    ratios: dict[str, float] = field(default_factory=dict)
    tie: bool = False
    confidence: float = 1.0
    stale: dict[str, str] = field(default_factory=dict)
    """How the key's cache entry is out of date (:meth:`Freshness.notes`): kind -> line."""
    recheck: str = ""
    """What re-timing the cached winner found (``--arbiter-recheck``): a line that starts
    ``current:``, ``stale:``, ``no verdict`` or ``not re-timed``; empty: not re-timed."""


@dataclass(eq=False)
class _Verdict:
    """The gate's memoised verdict on one candidate: ``pass`` or ``decline`` (nothing of
    the key's own generated inputs could be checked) per layout of the inputs;
    ``reject`` or ``error`` for the whole key."""

    cand: Candidate
    kind: str
    reason: str


def _recheck_text(result: RecheckResult | None) -> str:
    """One line: what the re-timing of a cached winner found."""
    if result is None:
        return "not re-timed: the run's recheck budget was spent"
    if result.stale:
        return (f"stale: the cached winner {result.winner} now takes {result.ratio:.3g}x "
                f"the time of {result.faster} (sign test p={result.p_value:.2g}, "
                f"{result.rounds} paired rounds)")
    if result.detail:
        return f"no verdict on {result.winner}: {result.detail}"
    return (f"current: {result.winner} is still the fastest ({result.rounds} paired "
            f"rounds, ratio {result.ratio:.3g})")


def _plain_signature(op: str, target: str | None, inputs: Sequence[Any]) -> Any:
    """A signature for inputs without strides (other array types), None if unhashable."""
    try:
        sig = (op, target, *[(x.__class__, x.shape, x.dtype) for x in inputs])
        hash(sig)
    except (AttributeError, TypeError):
        return None
    return sig


def _default_accepts(cand: Candidate) -> Callable[..., bool] | None:
    """``None`` when ``cand`` keeps the base class's accept-everything ``accepts``."""
    method = cand.accepts
    if getattr(method, "__func__", None) is Candidate.accepts:
        return None
    return method


def _layout(inputs: Sequence[Any]) -> tuple[str, ...]:
    """Each input's memory layout class: C- or F-contiguous, strided, or unknown. A pass
    of the gate holds for the layout it was checked on. A strided input's class says, per
    axis, whether it steps as a C-contiguous array would (``c``), backwards (``-``), with
    gaps (``g``), not at all (``0``: broadcast) or into itself (``o``: overlapping
    windows): rows taken two by two, columns two by two, a reversed and a broadcast array
    are layouts each gated on its own."""
    out = []
    for x in inputs:
        flags = getattr(x, "flags", None)
        if flags is None:
            out.append("?")
        elif flags.c_contiguous:
            out.append("C")
        elif flags.f_contiguous:
            out.append("F")
        else:
            out.append("S" + _strided_class(x))
    return tuple(out)


def _strided_class(x: Any) -> str:
    try:
        step = int(x.itemsize)
        classes = []
        for stride, n in zip(reversed(x.strides), reversed(x.shape), strict=True):
            classes.append("c" if stride == step or n == 1 else "-" if stride < 0
                           else "0" if stride == 0 else "o" if stride < step else "g")
            step *= max(int(n), 1)
        return "".join(reversed(classes))
    except (AttributeError, TypeError, ValueError):
        return "?"


class Arbiter:
    """Dispatches ops to candidates and records every dispatch in a histogram.

    ``mode``: ``tune`` measures at the first cache miss; ``static`` uses the tier order
    on a miss; ``strict`` makes a miss an error (CI replay of a committed cache).
    ``recheck``: re-time each key dispatched from the cache, its winner against the
    runner-up, once per process (:mod:`pytest_arbiter.recheck`); a winner now slower is
    recorded as ``stale`` and, in tune mode, the key is measured again.
    ``gate``: F4-gate every candidate for a dispatch key before it first runs for it
    (on in every pytest run). Off (production's default), a candidate runs ungated only
    when the key's cache entry vouches for its current code (it was gated and timed
    with it); any other candidate (no entry, code changed since, never measured) is
    still gated before its first run. ``call_timeout_s``: the per-call watchdog of
    gate and timing calls.
    """

    def __init__(self, *, registry: CandidateRegistry | None = None,
                 ops: OpRegistry | None = None, cache: MeasureCache | None = None,
                 histogram: DispatchHistogram | None = None, mode: Mode = "tune",
                 policy: ComparePolicy | None = None, gate_seed: int = GATE_SEED,
                 gate: bool = True, call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S,
                 recheck: RecheckPolicy | None = None, recheck_budget: RunBudget | None = None,
                 ) -> None:
        if not is_mode(mode):
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
        self._checked: dict[tuple[DispatchKey, str, tuple[str, ...]], _Verdict] = {}
        self._keyplans: dict[tuple[str, DispatchKey], _KeyPlan] = {}
        self._plans: dict[Any, _Plan] = {}
        self._older: dict[Any, _Plan] = {}
        self._mode_plans: dict[str, tuple[dict[Any, _Plan], dict[Any, _Plan]]] = {}
        self._lock = threading.RLock()
        self._fresh: list[tuple[DispatchKey, dict[str, tuple[Outcome, str]]]] = []
        self.recheck = recheck
        self.recheck_budget = recheck_budget
        self._rechecking: set[CacheKey] = set()
        self._replayed: set[tuple[CacheKey, str]] = set()
        self.rechecks: dict[CacheKey, RecheckResult | None] = {}
        """Each key dispatched from the cache and re-timed (``recheck``): its result;
        None when the run's recheck budget was spent before it."""

    # -- the hot path ---------------------------------------------------------------

    def dispatch(self, op: str, *inputs: Any, target: str | None = None) -> Any:
        """Run ``op`` on ``inputs`` with the arbitrated candidate and record the outcome."""
        return self.dispatch_inputs(op, inputs, target)

    def dispatch_inputs(self, op: str, inputs: tuple[Any, ...], target: str | None) -> Any:
        """:meth:`dispatch` with the inputs as one tuple (what ``pytest_arbiter.dispatch``
        calls: no argument repacking on the way)."""
        try:
            if len(inputs) == 1:
                x = inputs[0]
                sig: Any = (op, target, x.__class__, x.shape, x.dtype, x.strides)
            elif len(inputs) == 2:
                a, b = inputs
                sig = (op, target, a.__class__, a.shape, a.dtype, a.strides,
                       b.__class__, b.shape, b.dtype, b.strides)
            else:
                sig = (op, target, *[(x.__class__, x.shape, x.dtype, x.strides)
                                     for x in inputs])
            plan = self._plans.get(sig)
        except (AttributeError, TypeError):
            sig, plan = _plain_signature(op, target, inputs), None
        if (plan is None or plan.generation != self.registry.generation
                or plan.cache_version != self.cache.version):
            plan = self._find_plan(self.mode, op, inputs, target, sig)
            if self._fresh:
                return self._run_slow(plan.keyplan, inputs, -1, None,
                                      self._take_fresh(plan.keyplan.key))
        run = plan.run
        if run is None:
            return self._run_slow(plan.keyplan, inputs, -1, None)
        pre = plan.pre
        if pre is not None:
            try:
                if any(check(*inputs) for check in pre):
                    return self._run_slow(plan.keyplan, inputs, -1, None)
            except Exception:
                return self._run_slow(plan.keyplan, inputs, -1, None)  # it records them
        accepts = plan.accepts
        try:
            if accepts is None or accepts(*inputs):
                out = run(*inputs)
                plan.won()  # type: ignore[misc]
                return out
        except Exception as exc:
            return self._run_slow(plan.keyplan, inputs, plan.start, exc)
        return self._run_slow(plan.keyplan, inputs, plan.start, False)

    def dispatch_as(self, mode: Mode, op: str, *inputs: Any, target: str | None = None) -> Any:
        """:meth:`dispatch` in another mode, on this arbiter's cache, gate and histogram."""
        if mode == self.mode:
            return self.dispatch_inputs(op, inputs, target)
        if not is_mode(mode):
            raise ValueError(f"unknown arbiter mode {mode!r}; modes are {', '.join(MODES)}")
        sig = _plain_signature(op, target, inputs)
        young, old = self._tables(mode)
        plan = young.get(sig) or old.get(sig) if sig is not None else None
        if (plan is None or plan.generation != self.registry.generation
                or plan.cache_version != self.cache.version):
            plan = self._find_plan(mode, op, inputs, target, sig)
        return self._run_slow(plan.keyplan, inputs, -1, None,
                              self._take_fresh(plan.keyplan.key))

    # -- the slow path --------------------------------------------------------------

    def _record(self, key: HistogramKey, reason: str) -> None:
        self.histogram.add(key)
        if key not in self.reasons:
            self.reasons[key] = reason

    def _take_fresh(self, key: DispatchKey) -> dict[str, tuple[Outcome, str]]:
        """The findings waiting for ``key``'s dispatch; those of other keys (planned by
        another thread meanwhile) are recorded now, under their own target and op."""
        with self._lock:
            parts, self._fresh = self._fresh, []
        found: dict[str, tuple[Outcome, str]] = {}
        for part_key, part in parts:
            if part_key == key:
                found.update(part)
            else:
                self._record_fresh(part_key.target, part_key.op, part)
        return found

    def _run_slow(self, kp: _KeyPlan, inputs: Sequence[Any], start: int,
                  first: BaseException | bool | None,
                  fresh: dict[str, tuple[Outcome, str]] | None = None) -> Any:
        return self._run_steps(kp, inputs, start, first, fresh if fresh is not None else {})

    def _run_steps(self, kp: _KeyPlan, inputs: Sequence[Any], start: int,
                   first: BaseException | bool | None,
                   fresh: dict[str, tuple[Outcome, str]]) -> Any:
        """Every dispatch but the fast step's success: declines, errors, candidates that
        are blocked (recorded when the dispatch reaches them), the gate of a candidate
        not yet gated for these inputs' layout, and the reference when nothing could run.

        ``first``: what the fast step ``start`` already did (raised, or ``False``:
        declined through ``accepts``); ``None``: nothing ran yet.
        """
        target, op_name = kp.key.target, kp.key.op

        def record(key: HistogramKey, reason: str) -> None:
            fresh.pop(key.selected, None)  # reached now: recorded once, here
            self._record(key, reason)

        declined: tuple[str, str] | None = None
        reached = False
        for index, step in enumerate(kp.steps):
            name = step.cand.name
            if index == start and first is not None:
                reached = True
                if first is False:
                    declined = declined or (name, "declined the inputs (accepts() returned "
                                                  "False)")
                elif isinstance(first, Decline):
                    declined = declined or (name, first.reason)
                else:
                    record(HistogramKey(target, op_name, name, "error"),
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
                reached = True
                record(HistogramKey(target, op_name, name, "error"),
                             f"accepts() raised {_exc_text(exc)}")
                continue
            reached = True
            if step.blocked is not None:
                record(*step.blocked)
                continue
            if not self._ungated(kp, step, inputs):
                kind, reason = self._gate_for(kp, step.cand, inputs)
                if kind == "decline":
                    declined = declined or (name, reason)
                    continue
                if kind != "pass":
                    record(HistogramKey(target, op_name, name,
                                  "rejected" if kind == "reject" else "error"), reason)
                    continue
            try:
                out = step.run(*inputs)
            except Decline as dec:
                declined = declined or (name, dec.reason)
                continue
            except Exception as exc:
                record(HistogramKey(target, op_name, name, "error"), _exc_text(exc))
                continue
            step.won()
            self._record_fresh(target, op_name, fresh)
            return out
        if declined is not None:
            record(HistogramKey(target, op_name, declined[0], "degraded"), declined[1])
        elif not reached:
            record(HistogramKey(target, op_name, NO_CANDIDATE, "no_candidate"), kp.no_candidate)
        self._record_fresh(target, op_name, fresh)
        return kp.op.run_reference(*inputs)

    def _record_fresh(self, target: str, op_name: str,
                      fresh: dict[str, tuple[Outcome, str]]) -> None:
        """What the measurement of this dispatch found wrong and the loop did not reach."""
        for name, (outcome, reason) in sorted(fresh.items()):
            self._record(HistogramKey(target, op_name, name, outcome), reason)

    # -- planning -------------------------------------------------------------------

    def _tables(self, mode: Mode) -> tuple[dict[Any, _Plan], dict[Any, _Plan]]:
        if mode == self.mode:
            return self._plans, self._older
        found = self._mode_plans.get(mode)
        if found is None:
            found = self._mode_plans.setdefault(mode, ({}, {}))
        return found

    def _find_plan(self, mode: Mode, op_name: str, inputs: Sequence[Any], target: str | None,
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

    def _remember(self, mode: Mode, sig: Any, plan: _Plan) -> None:
        # two generations: a plan used since the last rotation survives it, so the cost
        # stays flat for any working set of up to MAX_PLANS signatures
        with self._lock:
            young, old = self._tables(mode)
            if len(young) >= MAX_PLANS:
                old.clear()
                old.update(young)
                young.clear()
            young[sig] = plan

    def _invalidate(self, key: DispatchKey) -> None:
        """Drop the plans of one dispatch key (a candidate of it was just blocked)."""
        with self._lock:
            for mode in [m for m, k in self._keyplans if k == key]:
                self._keyplans.pop((mode, key), None)
            for table in (self._plans, self._older,
                          *(t for pair in self._mode_plans.values() for t in pair)):
                for sig in [s for s, p in table.items() if p.keyplan.key == key]:
                    del table[sig]

    def _plan(self, mode: Mode, op_name: str, inputs: Sequence[Any], target: str | None
              ) -> _Plan:
        the_op = self.ops.get(op_name)
        the_op.validate(*inputs)
        if target is not None and target not in known_targets():
            raise ValueError(f"dispatch of {op_name!r}: unknown target {target!r}; known "
                             f"targets: {', '.join(known_targets())}")
        resolved = target if target is not None else (
            target_of_array(inputs[0]) if inputs else "cpu")
        generation = self.registry.generation
        region = the_op.region_of(*inputs)
        needs = self.registry.alignment_needs(the_op.name, resolved)
        key = DispatchKey(resolved, the_op.name, region.bucket(needs), region.dtype)
        kp = self._keyplans.get((mode, key))
        if kp is None or kp.stamp != (generation, self.cache.version) or kp.retry:
            kp = self._keyplan(mode, the_op, region, needs, key, inputs)
        start, pre = self._fast_start(kp, inputs)
        if kp.fresh:
            with self._lock:
                self._fresh.append((kp.key, kp.fresh))  # for the dispatch that is planning
            kp.fresh = {}
        return _Plan(kp, start, pre, generation, self.cache.version)

    def _fast_start(self, kp: _KeyPlan, inputs: Sequence[Any]
                    ) -> tuple[int, tuple[Callable[..., bool], ...]]:
        """The step that serves inputs of this signature on the fast path, gated now if
        it was not (-1: the slow path every time), and the ``accepts`` of the steps
        above it that declined these inputs."""
        pre: list[Callable[..., bool]] = []
        for index, step in enumerate(kp.steps):
            try:
                if step.accepts is not None and not step.accepts(*inputs):
                    pre.append(step.accepts)
                    continue
            except Exception:
                return -1, ()  # recorded on each dispatch, by the slow path
            if step.blocked is not None or self._ungated(kp, step, inputs):
                # reached by every such dispatch: charged each time, on the slow path
                return (-1, ()) if step.blocked is not None else (index, tuple(pre))
            kind, _ = self._gate_for(kp, step.cand, inputs)
            if kind == "pass":
                return index, tuple(pre)
            if kind == "decline":
                found = self._checked.get((kp.key, step.cand.name, _layout(inputs)))
                if found is not None and found.kind == "pass":
                    # right for the key, raised Decline on these inputs: it stays the fast
                    # step, so inputs of this signature it can run reach it
                    return index, tuple(pre)
                if found is None:
                    return -1, ()  # nothing checked yet: gated again on the next inputs
                continue  # it declined the key's own generated inputs: not for this key
            return -1, ()  # just blocked: charged on the slow path
        return -1, ()

    def _gate_for(self, kp: _KeyPlan, cand: Candidate, inputs: Sequence[Any]
                  ) -> tuple[str, str]:
        """The gate's verdict on ``cand`` for ``kp``'s key and these inputs' memory
        layout: ``pass``, ``decline`` (for these inputs), ``reject`` or ``error``;
        memoised per process. A kernel wrong on column-major inputs is rejected for
        them, whichever layout came first, and still serves the row-major ones it got
        right."""
        memo_key = (kp.key, cand.name, _layout(inputs))
        found = self._checked.get(memo_key)
        if found is not None and found.cand is cand:
            return found.kind, found.reason
        kind, reason = _gate_verdict(self._gate_report(kp.op, cand, inputs))
        self._remember_verdict(kp, cand, inputs, kind, reason)
        if kind == "decline-inputs":
            return "decline", reason
        return kind, reason

    def _ungated(self, kp: _KeyPlan, step: _Step, inputs: Sequence[Any]) -> bool:
        """Whether ``step`` runs these inputs without the gate: only with the gate off, a
        candidate the corpus vouches for, on row-major inputs (what it was gated on when
        measured), and not rejected in this process."""
        return (not self.gate_enabled and step.vouched
                and all(layout == "C" for layout in _layout(inputs))
                and not self._known_bad(kp, step.cand, inputs))

    def _known_bad(self, kp: _KeyPlan, cand: Candidate, inputs: Sequence[Any]) -> bool:
        """The gate already rejected ``cand`` (or it raised) for this key and layout in
        this process: vouched for by the corpus or not, it does not run."""
        found = self._checked.get((kp.key, cand.name, _layout(inputs)))
        return found is not None and found.cand is cand and found.kind in ("reject", "error")

    def _remember_verdict(self, kp: _KeyPlan, cand: Candidate, inputs: Sequence[Any],
                          kind: str, reason: str) -> None:
        memo_key = (kp.key, cand.name, _layout(inputs))
        if kind in ("reject", "error"):
            self._checked[memo_key] = _Verdict(cand, kind, reason)
            self._invalidate(kp.key)
        elif kind in ("pass", "decline-inputs"):
            self._checked[memo_key] = _Verdict(cand, "pass", "")
        elif kind == "decline" and kp.op.gate_inputs is not None:
            # it declined the key's own generated inputs too: not run for this layout
            self._checked[memo_key] = _Verdict(cand, "decline", reason)
        # a user op's decline checked nothing: gated again on the next inputs

    def _gate_report(self, the_op: Op, cand: Candidate, inputs: Sequence[Any]) -> GateReport:
        region = the_op.region_of(*inputs)
        return f4_gate(cand, the_op, inputs=inputs, region=region, seed=self.gate_seed,
                       call_timeout_s=self.call_timeout_s)

    def _measure_verdict(self, kp: _KeyPlan, cand: Candidate,
                         inputs: Sequence[Any]) -> tuple[str, str]:
        """The measurement's gate: the memoised verdict, in the measurement's terms
        (``decline-inputs`` for a candidate right for the key that declined these)."""
        found = self._checked.get((kp.key, cand.name, _layout(inputs)))
        if found is None or found.cand is not cand:
            kind, reason = _gate_verdict(self._gate_report(kp.op, cand, inputs))
            self._remember_verdict(kp, cand, inputs, kind, reason)
            return kind, reason
        return found.kind, found.reason

    def _policy(self) -> ComparePolicy:
        policy = self.policy or ComparePolicy()
        if self.call_timeout_s is not None and policy.call_timeout_s is None:
            policy = replace(policy, call_timeout_s=self.call_timeout_s)
        return policy

    def _keyplan(self, mode: Mode, the_op: Op, region: Region, needs: tuple[int, ...],
                 key: DispatchKey, inputs: Sequence[Any]) -> _KeyPlan:
        target = key.target
        pool = self.registry.for_op(the_op.name, target)
        passed_over: dict[str, str] = {}
        errors: dict[str, str] = {}
        found = probe_device(target)
        selection: Selection | None = None
        entry: CacheEntry | None = None
        stale: dict[str, str] = {}
        environment: dict[str, str] = {}
        stub = _KeyPlan(the_op, key, mode, (), "", (0, 0))  # what the measurement gates with
        if not isinstance(found, DeviceInfo):
            for cand in pool:
                passed_over[cand.name] = f"unavailable: {found}"
            order: list[Candidate] = []
            source: Source = "static"
        else:
            ckey = CacheKey(found.tag, target, the_op.name, key.bucket, key.dtype)
            if mode == "tune":
                selection = measured_arbitrate(
                    the_op, inputs, pool, self.cache, target=target, policy=self._policy(),
                    gate_seed=self.gate_seed, needs=needs,
                    verdict=(lambda c: self._measure_verdict(stub, c, inputs))
                    if self.gate_enabled else None)
                errors.update(selection.errors)
                passed_over.update(selection.passed_over)
            entry = self.cache.get(ckey)
            environment = current_environment(target)
            if entry is not None:
                applicable = _screen(region, pool, None, {}, errors={})
                fresh = freshness(entry, applicable, environment,
                                  [c.name for c in applicable if _accepts(c, inputs, {}, None)])
                stale = fresh.notes(entry.winner)
                if mode == "strict" and (fresh.winner_changed or fresh.to_measure):
                    raise StaleEntry(
                        f"strict mode: the cached entry of {region.describe()} on target "
                        f"{target!r} (device {found.tag}, bucket {key.bucket}) is stale: "
                        + "; ".join(v for k, v in sorted(stale.items()) if k != "reverify")
                        + "; tune with --arbiter-tune")
                if fresh.winner_changed:
                    entry = None  # its timings are of other code: the tier order runs
            if (entry is not None and self.recheck is not None
                    and (selection is None or selection.source == "cached")
                    and self._reserve_recheck(ckey)):
                stale_now = self._recheck(stub, region, entry, pool, inputs, ckey)
                if stale_now and mode == "tune":
                    # the re-timing replaces the entry: the key is measured again
                    selection = measured_arbitrate(
                        the_op, inputs, pool, self.cache, target=target,
                        policy=self._policy(), gate_seed=self.gate_seed, needs=needs,
                        remeasure=True, supersede=True,
                        verdict=lambda c: self._measure_verdict(stub, c, inputs))
                    errors.update(selection.errors)
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
                if mode == "strict" and not stale:
                    screened = _screen(region, pool, inputs, {}, errors={})
                    if screened:
                        raise CacheMiss(
                            f"strict mode: no cached winner for {region.describe()} on target "
                            f"{target!r} (device {found.tag}, bucket {key.bucket}); tune with "
                            "--arbiter-tune or add the entry to the cache")
        steps: list[_Step] = []
        for cand in order:
            usable_errors: dict[str, str] = {}
            if not _usable(cand, region, passed_over, usable_errors):
                if not usable_errors:
                    continue
                errors.update(usable_errors)
            elif cand.name not in passed_over:
                _accepts(cand, inputs, passed_over, None)  # the explain text, no more
            blocked: tuple[HistogramKey, str] | None = None
            if cand.name in usable_errors:
                blocked = (HistogramKey(target, the_op.name, cand.name, "error"),
                           usable_errors[cand.name])
            if blocked is not None:
                self.reasons.setdefault(*blocked)
            won = self.histogram.counter(HistogramKey(target, the_op.name, cand.name, "won"))
            steps.append(_Step(cand, _default_accepts(cand), cand.run, won, blocked,
                               entry is not None and vouched(entry, cand, environment)))
        if not isinstance(found, DeviceInfo):
            why = f"no {target} device: {found}"
        elif not pool:
            why = f"no candidate of {the_op.name!r} is registered for target {target!r}"
        else:
            why = "; ".join(f"{n}: {r}" for n, r in sorted(passed_over.items())) or (
                "no candidate applies")
        found_now = dict(selection.found) if selection is not None else {}
        if entry is not None and self.gate_enabled and isinstance(found, DeviceInfo) and (
                selection is None or selection.source == "cached"):
            found_now.update(self._replayed_rejections(entry, pool, region))
        retry = mode == "tune" and entry is not None and any(
            _declined_on_inputs(entry, c.name) for c in pool)
        kp = _KeyPlan(the_op, key, mode, tuple(steps), why,
                      (self.registry.generation, self.cache.version), found_now, retry)
        with self._lock:
            self._keyplans[(mode, key)] = kp
        why_not = {**passed_over, **errors}
        rechecked = ""
        if isinstance(found, DeviceInfo):
            ckey = CacheKey(found.tag, target, the_op.name, key.bucket, key.dtype)
            if ckey in self.rechecks:
                rechecked = _recheck_text(self.rechecks[ckey])
        self._note(key, source, [s.cand.name for s in steps if s.cand.name not in why_not],
                   why_not, selection, entry, stale, rechecked)
        return kp

    def _replayed_rejections(self, entry: CacheEntry, pool: Sequence[Candidate],
                             region: Region) -> dict[str, tuple[Outcome, str]]:
        """The candidates the cached entry says failed the F4 gate (or raised) when it
        was measured, with the code they still have: recorded once per key and process,
        so a run replaying the corpus shows a broken kernel as a tuning run does (and a
        baseline written from either keeps it)."""
        out: dict[str, tuple[Outcome, str]] = {}
        by_name = {c.name: c for c in pool}
        for name, why in sorted(entry.rejected.items()):
            cand = by_name.get(name)
            if cand is None or not _usable(cand, region, {}, None):
                continue
            seen = entry.considered.get(name)
            if seen is None or seen.outcome not in ("rejected", "error") \
                    or seen.fingerprint != fingerprint_of(cand):
                continue  # its code changed since, or unknown (a v1/v2 entry)
            with self._lock:
                if (entry.key, name) in self._replayed:
                    continue
                self._replayed.add((entry.key, name))
            if why.startswith("error: "):
                out[name] = ("error", f"when measured: {why.removeprefix('error: ')}")
            else:
                out[name] = ("rejected", f"when measured: {why}")
        return out

    def _reserve_recheck(self, ckey: CacheKey) -> bool:
        """Whether this thread re-times ``ckey``: once per key and process."""
        with self._lock:
            if ckey in self._rechecking:
                return False
            self._rechecking.add(ckey)
            return True

    def _recheck(self, stub: _KeyPlan, region: Region, entry: CacheEntry,
                 pool: Sequence[Candidate], inputs: Sequence[Any], ckey: CacheKey) -> bool:
        """Re-time the cached leader against the runner-up on these inputs (both gated
        first); record ``stale`` when the leader is now slower. Whether it is."""
        assert self.recheck is not None
        by_name = {c.name: c for c in pool}
        pair: list[Candidate] = []
        for row in entry.ranking:
            cand = by_name.get(row.name)
            if (cand is None or not _usable(cand, region, {}, None)
                    or not _accepts(cand, inputs, {}, None)
                    or self._measure_verdict(stub, cand, inputs)[0] != "pass"):
                continue
            pair.append(cand)
            if len(pair) == 2:
                break
        if len(pair) < 2:
            return False  # nothing to re-time the leader against
        budget = self.recheck_budget
        if budget is not None and not budget.take(self.recheck.key_budget_s):
            self.rechecks[ckey] = None
            return False
        fns: dict[str, Callable[[], Any]] = {}
        for cand in pair:
            try:
                prepared = cand.prepare_inputs(*inputs)
            except Exception:
                return False  # the dispatch's own path records what is wrong with it
            fns[cand.name] = functools.partial(cand.run, *prepared)
        with measurement_lock(ckey.device):
            result = recheck(pair[0].name, fns, policy=self.recheck,
                             timer=timer_for(ckey.target))
        if budget is not None:
            budget.settle(self.recheck.key_budget_s, result.spent_ns / 1e9)
        self.rechecks[ckey] = result
        if not result.stale:
            return False
        self._record(HistogramKey(ckey.target, ckey.op, result.winner, "stale"),
                     f"{'/'.join(ckey)}: {_recheck_text(result)}")
        return True

    def _note(self, key: DispatchKey, source: Source, order: list[str],
              passed_over: dict[str, str], selection: Selection | None,
              entry: CacheEntry | None, stale: dict[str, str], rechecked: str = "") -> None:
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
            *key, source, order, dict(passed_over), ratios,
            entry.tie if entry else False, entry.confidence if entry else 1.0, dict(stale),
            rechecked or (previous.recheck if previous is not None else ""))

    # -- reasons, for tests and the summary -----------------------------------------

    def _reasons_of(self, outcome: str) -> dict[tuple[str, str, str], str]:
        return {(k.target, k.op, k.selected): v for k, v in self.reasons.items()
                if k.outcome == outcome}

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
