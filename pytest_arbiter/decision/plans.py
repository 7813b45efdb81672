"""Memoised dispatch plans: per dispatch key its ordered steps (:class:`KeyPlan`), per
input signature the step that serves it on the hot path (:class:`Plan`), and the
two-generation tables that hold them (:class:`PlanTables`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.ops import Op
from pytest_arbiter.decision.record import REFERENCE_SEVERITY
from pytest_arbiter.decision.states import MAX_PLANS, DispatchKey, Mode
from pytest_arbiter.gating.histogram import REFERENCE, HistogramKey
from pytest_arbiter.timing.measure import ComparePolicy


@dataclass(eq=False)
class Step:
    """One candidate of a key's order, with its counter.

    ``blocked``: the histogram key and reason of a candidate whose ``available()``
    raised: it never runs for the key, and every dispatch that reaches it records the
    error. ``vouched``: the key's cache entry vouches for its current code (gated and
    timed with it): a run with the gate off runs it ungated.
    """

    cand: Candidate
    accepts: Callable[..., bool] | None  # None: it accepts everything
    run: Callable[..., Any]
    won: Callable[[], int]
    blocked: tuple[HistogramKey, str] | None = None
    vouched: bool = False




@dataclass(frozen=True)
class Fallback:
    """The key's measured winner, for telling a silent fallback from a measured order:
    a dispatch another candidate serves is ``degraded`` when the winner is unavailable
    here, or declined inputs of the shapes its entry measured it on."""

    winner: str
    unavailable: str
    """Why the winner cannot run here at all (empty: it can)."""
    shapes: tuple[tuple[int, ...], ...]
    ratios: dict[str, float]
    """The entry's paired ratio to the winner per candidate timed beside it: the
    measured slowdown, the number ``show`` prints and the ranking read."""
    registered: bool = True
    """False: the winner is not registered in this run at all (its module, or a package
    it needs, is missing; or it was removed)."""
    margin: float = ComparePolicy.tie_margin
    """The tie margin of the comparisons: a paired ratio under ``1 + margin`` is as fast
    (the tie rule's own test, on the stored ratio)."""

    def measured_on(self, inputs: Sequence[Any]) -> bool:
        """Whether ``inputs`` are what the entry measured: its shapes, arrays row-major
        (a tuning dispatch's inputs; another layout is a decline the key does not vouch
        for; a plain number has shape ``()``)."""
        try:
            return (all(getattr(x, "flags", None) is None or x.flags.c_contiguous
                        for x in inputs)
                    and tuple(tuple(int(d) for d in np.shape(x)) for x in inputs)
                    == self.shapes)
        except (AttributeError, TypeError, ValueError):
            return False

    def slowdown(self, ran: str) -> float:
        """How much slower ``ran`` was than the winner when measured: the reference,
        never timed, is the slowest there is (:data:`~.record.REFERENCE_SEVERITY`); 0
        when ``ran`` was not timed."""
        if ran == REFERENCE:
            return REFERENCE_SEVERITY
        return self.ratios.get(ran, 0.0)

    def worse(self, ran: str) -> bool:
        """Whether ``ran`` serving in the winner's place is a degrade: it measured slower
        (its stored paired ratio ``1 + margin`` or more: not a tie), was never timed
        beside the winner, or is the reference. One as fast serving is the ranking at
        work."""
        ratio = self.slowdown(ran)
        return ratio == 0 or ratio - 1.0 >= self.margin

    def reason(self, why: str, ran: str) -> str:
        """The degrade's reason: the winner, why it could not run, who ran, how much slower."""
        ratio = self.slowdown(ran)
        if ran != REFERENCE and ratio > 0:
            slower = f", {ratio:.3g}x slower when measured"
        else:
            slower = "" if ran == REFERENCE else ", never timed against it"
        gone = ("; if it was removed, drop its entries: pytest-arbiter forget CACHE "
                f"--candidate {self.winner}") if not self.registered else ""
        return (f"the measured winner {self.winner} could not run here ({why}); "
                f"{ran} ran instead{slower}{gone}")


@dataclass(eq=False)
class KeyPlan:
    """The order of one dispatch key in one mode."""

    op: Op
    key: DispatchKey
    mode: Mode
    steps: tuple[Step, ...]
    no_candidate: str  # why nothing could run, when there are no steps
    stamp: tuple[int, int, int]
    retry: bool = False
    """Tuning, the key's entry has a candidate that declined the only inputs it was
    tried on: each new input signature plans the key again, so the measurement tries it."""
    fallback: Fallback | None = None
    degraded: Callable[[], int] | None = None
    """The counter of a dispatch the winner did not serve (``fallback``)."""


class Plan(NamedTuple):
    """The memoised dispatch of one input signature, compiled for the hot path: what
    it unpacks in one step, with no stamp to check (a change of the registry or the
    cache swaps the whole table).

    ``run`` is ``None`` when the signature must take the slow path every time (a
    candidate above to charge, one not gated yet, or none that ran its first inputs).
    ``pre``: the ``accepts`` of higher steps that declined the first inputs; inputs of
    the same signature that one of them accepts take the slow path, so every input gets
    the same candidate and outcome whatever came first. ``won`` counts a dispatch the
    fast step served: ``won`` under its name, or ``degraded`` under the winner's.
    ``plain``: ``run`` when nothing needs checking first (no ``pre``, no ``accepts``),
    else ``None``: the one field the commonest hit tests.
    """

    plain: Callable[..., Any] | None
    won: Callable[[], int] | None
    keyplan: KeyPlan
    start: int
    run: Callable[..., Any] | None
    pre: tuple[Callable[..., bool], ...] | None
    accepts: Callable[..., bool] | None


def compile_plan(keyplan: KeyPlan, start: int, pre: tuple[Callable[..., bool], ...],
                 won: Callable[[], int] | None = None) -> Plan:
    """The :class:`Plan` of a signature served from step ``start`` (-1: none)."""
    fast = keyplan.steps[start] if 0 <= start < len(keyplan.steps) else None
    if fast is None or fast.blocked is not None:
        return Plan(None, None, keyplan, -1, None, None, None)
    plain = fast.run if not pre and fast.accepts is None else None
    return Plan(plain, won or fast.won, keyplan, start, fast.run, pre or None, fast.accepts)


class PlanTables:
    """Plans by input signature, per mode, in two generations: a plan used since the
    last rotation survives it, so the cost stays flat for any working set of up to
    :data:`MAX_PLANS` signatures. Signatures with the same plan share one
    :class:`Plan`; :meth:`reset` (the registry or the cache changed) starts afresh."""

    def __init__(self) -> None:
        self.keyplans: dict[tuple[Mode, DispatchKey], KeyPlan] = {}
        self.registered: set[tuple[str, str, str]] = set()
        """(target, op, candidate) registered for each (target, op) planned; the
        candidate ``""`` marks an op planned with none registered."""
        self.measured: set[tuple[str, ...]] = set()
        """The cache keys this process measured (or found current) when tuning."""
        self._young: dict[Mode, dict[Any, Plan]] = {}
        self._old: dict[Mode, dict[Any, Plan]] = {}
        self._shared: dict[Plan, Plan] = {}
        self._lock = threading.RLock()
        self.resets = 0
        """How many times the tables were thrown away: a plan built across a reset (the
        registry or the cache changed meanwhile) is not remembered."""

    def reset(self) -> None:
        """Forget every signature's plan (not the key plans: they carry their stamp)."""
        with self._lock:
            self._young, self._old, self._shared = {}, {}, {}
            self.resets += 1

    def shared(self, plan: Plan) -> Plan:
        """The one :class:`Plan` equal to ``plan`` (signatures of a key share it)."""
        return self._shared.setdefault(plan, plan)

    def set_keyplan(self, mode: Mode, key: DispatchKey, kp: KeyPlan) -> None:
        with self._lock:
            self.keyplans[(mode, key)] = kp

    def young(self, mode: Mode) -> dict[Any, Plan]:
        """The table the hot path reads (the arbiter keeps a reference to its own mode's)."""
        found = self._young.get(mode)
        if found is None:
            found = self._young.setdefault(mode, {})
            self._old.setdefault(mode, {})
        return found

    def older(self, mode: Mode, sig: Any) -> Plan | None:
        """A plan of the older generation, moved to the young one."""
        found = self._old.get(mode, {}).get(sig)
        if found is not None:
            self.remember(mode, sig, found)
        return found

    def remember(self, mode: Mode, sig: Any, plan: Plan, resets: int | None = None) -> None:
        """Keep ``plan`` for ``sig``, unless the tables were reset since ``resets`` (the
        count when planning began): it may be built from what changed."""
        with self._lock:
            if resets is not None and resets != self.resets:
                return
            young = self.young(mode)
            if len(young) >= MAX_PLANS:
                old = self._old[mode]
                old.clear()
                old.update(young)
                young.clear()
            young[sig] = plan

    def drop_target(self, target: str) -> None:
        """Forget the plans of every key of ``target`` (its device lane was lost)."""
        for key in {k for _, k in list(self.keyplans) if k.target == target}:
            self.drop(key)
        with self._lock:
            for table in (*self._young.values(), *self._old.values()):
                for sig in [s for s, p in table.items() if p.keyplan.key.target == target]:
                    del table[sig]

    def drop_op(self, target: str, op: str) -> None:
        """Forget the plans of every key of ``op`` on ``target`` (a candidate of it failed
        the gate for a numerical reason: it is gated on each key before it runs again)."""
        for key in {k for _, k in list(self.keyplans) if (k.target, k.op) == (target, op)}:
            self.drop(key)
        with self._lock:
            for table in (*self._young.values(), *self._old.values()):
                for sig in [s for s, p in table.items()
                            if (p.keyplan.key.target, p.keyplan.key.op) == (target, op)]:
                    del table[sig]

    def drop(self, key: DispatchKey) -> None:
        """Forget the plans of one dispatch key (a candidate of it was just blocked)."""
        with self._lock:
            for mode, k in [mk for mk in self.keyplans if mk[1] == key]:
                self.keyplans.pop((mode, k), None)
            for table in (*self._young.values(), *self._old.values()):
                for sig in [s for s, p in table.items() if p.keyplan.key == key]:
                    del table[sig]


_SCALARS = (bool, int, float, complex)


def signature(op: str, target: str | None, inputs: Sequence[Any]) -> Any:
    """The plan signature of inputs the hot path's own cannot read: arrays without
    strides (other array types) and plain numbers (their type: the value is passed
    through); None if unhashable."""
    try:
        sig = (op, target, *[x.__class__ if isinstance(x, _SCALARS) else
                             (x.__class__, x.shape, x.dtype, getattr(x, "strides", None))
                             for x in inputs])
        hash(sig)
    except (AttributeError, TypeError):
        return None
    return sig


def default_accepts(cand: Candidate) -> Callable[..., bool] | None:
    """``None`` when ``cand`` keeps the base class's accept-everything ``accepts``."""
    method = cand.accepts
    if getattr(method, "__func__", None) is Candidate.accepts:
        return None
    return method
