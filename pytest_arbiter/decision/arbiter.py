"""The arbiter: dispatches an op to the candidate its key's plan names, and records it.

``Arbiter.dispatch`` is the hot path: a memoised plan per input signature, the serving
candidate's ``accepts`` re-check, the call and one histogram count. Everything slow
(validation, the F4 gate, timing, cache writes, declines, errors) happens once per
signature in planning (:mod:`pytest_arbiter.decision.planner`), or on the slow path
(:meth:`Arbiter.run_steps`).

Lead-safety: with the gate on (every pytest run), a candidate runs for a dispatch key
only after it passed the F4 gate for that key in this process; one that fails is
passed over and recorded as ``rejected`` on every dispatch it would have served.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pytest_arbiter.core.candidates import REGISTRY, CandidateRegistry, known_targets
from pytest_arbiter.core.gate import GATE_SEED, GateReport
from pytest_arbiter.core.ops import OPS, OpRegistry
from pytest_arbiter.core.regions import Region
from pytest_arbiter.decision.context import ArbiterConfig
from pytest_arbiter.decision.gating import GateMemo, f4_gate, layout
from pytest_arbiter.decision.planner import build_keyplan
from pytest_arbiter.decision.plans import (
    KeyPlan,
    Plan,
    PlanTables,
    Step,
    compile_plan,
    signature,
)
from pytest_arbiter.decision.rechecking import Rechecker
from pytest_arbiter.decision.record import REFERENCE_SEVERITY, Record
from pytest_arbiter.decision.selection import DispatchEvent
from pytest_arbiter.decision.states import (
    ACCEPTS_FALSE,
    DEFAULT_CALL_TIMEOUT_S,
    MODES,
    DispatchKey,
    Mode,
    WinnerOut,
    exc_text,
    is_mode,
)
from pytest_arbiter.errors import CacheMiss, Decline
from pytest_arbiter.extend.device import target_of_inputs, unusable_reason
from pytest_arbiter.gating.histogram import NO_CANDIDATE, REFERENCE, DispatchHistogram, HistogramKey
from pytest_arbiter.store.cache import MeasureCache
from pytest_arbiter.timing.measure import ComparePolicy
from pytest_arbiter.timing.recheck import RecheckPolicy, RunBudget

StepOutcome = Literal["ran", "declined", "passed", "error", "rejected"]
"""What one step did with a dispatch: ran it, declined it, was passed over having been
recorded already (blocked), or the outcome to record."""
_Tried = tuple[StepOutcome, str, Any]


class Arbiter:
    """Dispatches ops to candidates and records every dispatch in a histogram.

    ``mode``: ``tune`` measures at the first cache miss; ``static`` uses the tier order
    on a miss; ``strict`` makes a miss an error (CI replay of a committed cache).
    ``recheck``: re-time each key dispatched from the cache, its winner against the
    runner-up, once per process (:mod:`pytest_arbiter.timing.recheck`); a winner now slower is
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
        self.mode = mode
        self.config = ArbiterConfig(policy, gate_seed, gate, call_timeout_s)
        self.record = Record(histogram if histogram is not None else DispatchHistogram())
        self.plans = PlanTables()
        self.hot = self.plans.young(mode)
        """The plan table of this arbiter's mode: what a dispatch's signature finds."""
        self.registry.changed.add(self._plans_stale)
        self.cache.changed.add(self._plans_stale)
        self.ops.changed.add(self._plans_stale)
        # per shape where the gate is on (tests): with it off (production), what was not
        # vouched for is gated once per key and layout, not at every new length
        self.gates = GateMemo(gate_seed, call_timeout_s, self.plans.drop, self.plans.drop_op,
                              per_shape=gate)
        self.recheck = Rechecker(recheck, recheck_budget)
        self.events: dict[DispatchKey, DispatchEvent] = {}

    def stamp(self) -> tuple[int, int, int]:
        """What a key plan was made from: the registry's, the cache's and the ops'
        versions (a plan of older ones is made again)."""
        return self.registry.generation, self.cache.version, self.ops.generation

    def _plans_stale(self) -> None:
        """The registry, the ops or the cache changed: every signature plans again."""
        self.plans.reset()
        self.hot = self.plans.young(self.mode)

    # -- what others read -------------------------------------------------------------

    @property
    def histogram(self) -> DispatchHistogram:
        return self.record.histogram

    @property
    def reasons(self) -> dict[HistogramKey, str]:
        """Why each degraded, rejected, error and no_candidate entry happened (the first
        reason seen): the decline's reason, the gate's report line, the exception."""
        return self.record.reasons

    @property
    def gate_enabled(self) -> bool:
        return self.config.gate

    @property
    def gate_seed(self) -> int:
        return self.config.gate_seed

    @property
    def rechecks(self) -> dict[Any, Any]:
        """Each key dispatched from the cache and re-timed: its result (None: the run's
        recheck budget was spent before it)."""
        return self.recheck.results

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

    # -- the hot path -------------------------------------------------------------------

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
            plan = self.hot.get(sig)
        except (AttributeError, TypeError):
            sig = signature(op, target, inputs)
            plan = self.hot.get(sig) if sig is not None else None
        if plan is None:
            plan = self._find_plan(self.mode, op, inputs, target, sig)
        plain = plan[0]  # by index: unpacking a NamedTuple takes the generic path
        if plain is None:
            if plan[4] is None:
                return self.run_steps(plan[2], inputs, -1, None)
            return self._checked(plan, inputs)
        try:
            out = plain(*inputs)
        except Exception as exc:
            return self.run_steps(plan[2], inputs, plan[3], exc)
        plan[1]()  # type: ignore[misc]  # set wherever run is
        return out

    def _checked(self, plan: Plan, inputs: tuple[Any, ...]) -> Any:
        """The hot path of a plan whose fast step, or a step above it, has ``accepts``."""
        _, won, kp, start, run, pre, accepts = plan
        if pre is not None:
            try:
                if any(check(*inputs) for check in pre):
                    return self.run_steps(kp, inputs, -1, None)
            except Exception:
                return self.run_steps(kp, inputs, -1, None)  # it records them
        try:
            if accepts is None or accepts(*inputs):
                out = run(*inputs)  # type: ignore[misc]
                won()  # type: ignore[misc]
                return out
        except Exception as exc:
            return self.run_steps(kp, inputs, start, exc)
        return self.run_steps(kp, inputs, start, False)

    def dispatch_as(self, mode: Mode, op: str, *inputs: Any, target: str | None = None) -> Any:
        """:meth:`dispatch` in another mode, on this arbiter's cache, gate and histogram."""
        if mode == self.mode:
            return self.dispatch_inputs(op, inputs, target)
        if not is_mode(mode):
            raise ValueError(f"unknown arbiter mode {mode!r}; modes are {', '.join(MODES)}")
        sig = signature(op, target, inputs)
        plan = self.plans.young(mode).get(sig) if sig is not None else None
        if plan is None:
            plan = self._find_plan(mode, op, inputs, target, sig)
        return self.run_steps(plan.keyplan, inputs, -1, None)

    # -- the slow path --------------------------------------------------------------------

    def run_steps(self, kp: KeyPlan, inputs: Sequence[Any], start: int,
                  first: BaseException | bool | None) -> Any:
        """Every dispatch but the fast step's success: declines, errors, candidates that
        are blocked (recorded when the dispatch reaches them), the gate of a candidate
        not yet gated for these inputs' layout, and the reference when nothing could run.

        ``first``: what the fast step ``start`` already did (raised, or ``False``:
        declined through ``accepts``); ``None``: nothing ran yet.
        """
        try:
            return self._steps(kp, inputs, start, first)
        finally:
            self.gates.release_trials()  # they hold the inputs, many times their size

    def _steps(self, kp: KeyPlan, inputs: Sequence[Any], start: int,
               first: BaseException | bool | None) -> Any:
        target, op_name = kp.key.target, kp.key.op
        declined: tuple[str, str] | None = None
        failed: dict[str, WinnerOut] = {}
        reached = False
        for index, step in enumerate(kp.steps):
            name = step.cand.name
            if index == start and first is not None:
                outcome = _first_outcome(first)
            else:
                outcome = self._try_step(kp, step, inputs)
            if outcome[0] == "declined":
                declined = declined or (name, outcome[1])
                continue
            reached = True
            if outcome[0] == "ran":
                return self._served(kp, step, inputs, declined, outcome[2], failed)
            if outcome[0] == "error" or outcome[0] == "rejected":
                failed[name] = outcome[0]
                self.record.add(HistogramKey(target, op_name, name, outcome[0]), outcome[1],
                                kp.key)
                self._note_passed_over(kp, name, outcome[1])
                if unusable_reason(target) is not None:
                    # the lane is lost (a sticky fault): nothing more is sent there, and
                    # the next dispatches plan again: no_candidate, with the reason
                    self.plans.drop_target(target)
                    break
        fb = kp.fallback
        fallback = ""
        if declined is not None:
            self.record.add(HistogramKey(target, op_name, declined[0], "degraded"), declined[1],
                            severity=REFERENCE_SEVERITY)
        elif fb is not None and fb.unavailable:
            # the measured winner cannot run here, and nothing else could: the reference
            fallback = fb.reason(fb.unavailable, REFERENCE)
            self.record.add(HistogramKey(target, op_name, fb.winner, "degraded"), fallback,
                            severity=fb.slowdown(REFERENCE))
        elif not reached:
            self.record.add(HistogramKey(target, op_name, NO_CANDIDATE, "no_candidate"),
                            kp.no_candidate)
        self._note_ran(kp, REFERENCE, declined, failed, fallback)
        return kp.op.run_reference(*inputs)

    def _note_ran(self, kp: KeyPlan, name: str, declined: tuple[str, str] | None,
                  failed: Mapping[str, WinnerOut], fallback: str = "") -> None:
        """What the key's last dispatch ran (the fast path's: when its plan is made), why
        the cached winner did not (``failed``: the steps rejected or raising on these
        inputs), and the degrade's reason: for ``--arbiter-explain`` and the summary's
        winners line, all three set together."""
        event = self.events.get(kp.key)
        if event is None:
            return
        event.ran, event.fallback = name, fallback
        fb = kp.fallback
        if fb is None or name == fb.winner:
            event.winner_out = ""
        elif fallback:
            event.winner_out = "degraded"
        elif fb.unavailable:
            event.winner_out = "unavailable"
        elif declined is not None and declined[0] == fb.winner:
            event.winner_out = "declined"
        else:
            event.winner_out = failed.get(fb.winner, "")

    def _note_passed_over(self, kp: KeyPlan, name: str, why: str) -> None:
        """A candidate the gate (or its own raise) took out of the key's order."""
        event = self.events.get(kp.key)
        if event is not None:
            event.passed_over.setdefault(name, why)
            if name in event.order:
                event.order = [n for n in event.order if n != name]

    def _try_step(self, kp: KeyPlan, step: Step, inputs: Sequence[Any]) -> _Tried:
        """One step on these inputs: ``("ran", "", output)``, ``("declined", why, None)``,
        or the outcome to record (``error``, ``rejected``) with its reason."""
        try:
            if step.accepts is not None and not step.accepts(*inputs):
                return "declined", ACCEPTS_FALSE, None
        except Decline as dec:
            return "declined", dec.reason, None
        except Exception as exc:
            return "error", f"accepts() raised {exc_text(exc)}", None
        if step.blocked is not None:
            self.record.add(*step.blocked, kp.key)
            return "passed", "", None
        if not self._ungated(kp, step, inputs):
            kind, reason, _ = self.gates.verdict(kp.op, kp.key, step.cand, inputs)
            if kind in ("decline", "decline_inputs"):
                return "declined", reason, None
            if kind != "pass":
                return ("rejected" if kind == "reject" else "error"), reason, None
        try:
            return "ran", "", step.run(*inputs)
        except Decline as dec:
            return "declined", dec.reason, None
        except Exception as exc:
            return "error", exc_text(exc), None

    def _served(self, kp: KeyPlan, step: Step, inputs: Sequence[Any],
                declined: tuple[str, str] | None, out: Any,
                failed: Mapping[str, WinnerOut]) -> Any:
        """Count a dispatch ``step`` served: ``won``, or ``degraded`` under the key's
        measured winner when it could not run here (:class:`~.plans.Fallback`)."""
        why = self._fallback_why(kp, step, inputs, declined)
        if why is None:
            step.won()
            self._note_ran(kp, step.cand.name, declined, failed)
            return out
        assert kp.fallback is not None
        reason = kp.fallback.reason(why, step.cand.name)
        self.record.add(HistogramKey(kp.key.target, kp.key.op, kp.fallback.winner, "degraded"),
                        reason, severity=kp.fallback.slowdown(step.cand.name))
        self._note_ran(kp, step.cand.name, declined, failed, reason)
        return out

    @staticmethod
    def _fallback_why(kp: KeyPlan, step: Step, inputs: Sequence[Any],
                      declined: tuple[str, str] | None) -> str | None:
        """Why the key's winner did not serve these inputs, when that is a silent
        fallback (None: it is not one)."""
        fb = kp.fallback
        if fb is None or step.cand.name == fb.winner:
            return None
        if fb.unavailable:
            # a winner that cannot run on this machine (its available() says no), and one
            # as fast serving: the ranking at work, not a degrade
            return fb.unavailable if not fb.registered or fb.worse(step.cand.name) else None
        if declined is not None and declined[0] == fb.winner and fb.measured_on(inputs):
            return f"it declined inputs of the shapes it was measured on: {declined[1]}"
        return None

    def _ungated(self, kp: KeyPlan, step: Step, inputs: Sequence[Any]) -> bool:
        """Whether ``step`` runs these inputs without the gate: only with the gate off, a
        candidate the corpus vouches for, on row-major inputs (what it was gated on when
        measured), not rejected in this process, for this key or for a numerical reason
        on another key of the op."""
        return (not self.config.gate and step.vouched
                and all(c == "C" for c in layout(inputs))
                and not self.gates.known_bad(kp.op, kp.key, step.cand, inputs)
                and not self.gates.suspect(kp.key, step.cand))

    # -- planning -------------------------------------------------------------------------

    def _find_plan(self, mode: Mode, op_name: str, inputs: Sequence[Any], target: str | None,
                   sig: Any) -> Plan:
        if sig is not None:
            found = self.plans.older(mode, sig)
            if found is not None:
                return found
        resets = self.plans.resets
        try:
            plan = self._plan(mode, op_name, inputs, target)
        except CacheMiss as exc:  # strict mode's refusal: the summary counts them
            self.record.refuse(exc.kind)
            raise
        finally:
            self.gates.release_trials()
        if sig is not None:
            self.plans.remember(mode, sig, plan, resets)
        return plan

    def _plan(self, mode: Mode, op_name: str, inputs: Sequence[Any], target: str | None
              ) -> Plan:
        the_op = self.ops.get(op_name)
        the_op.validate(*inputs)
        if target is not None and target not in known_targets():
            raise ValueError(f"dispatch of {op_name!r}: unknown target {target!r}; known "
                             f"targets: {', '.join(known_targets())}")
        resolved = target if target is not None else target_of_inputs(inputs)
        stamp = self.stamp()
        region = the_op.region_of(*inputs)
        needs = self.registry.alignment_needs(the_op.name, resolved)
        key = DispatchKey(resolved, the_op.name, region.bucket(needs), region.dtype)
        kp = self.plans.keyplans.get((mode, key))
        if kp is None or kp.stamp != stamp or kp.retry:
            kp = build_keyplan(self, mode, the_op, region, needs, key, inputs)
            self.plans.set_keyplan(mode, key, kp)
        start, pre, declined = self._fast_start(kp, inputs)
        won = self._plan_counter(kp, start, inputs, declined)
        return self.plans.shared(compile_plan(kp, start, pre, won))

    def _plan_counter(self, kp: KeyPlan, start: int, inputs: Sequence[Any],
                      declined: tuple[str, str] | None) -> Callable[[], int] | None:
        """The fast step's counter when it serves in the winner's place (a silent
        fallback: ``degraded``); None for its own ``won``. Notes what ran on the event."""
        if not 0 <= start < len(kp.steps):
            return None
        step = kp.steps[start]
        why = self._fallback_why(kp, step, inputs, declined)
        if why is None or kp.fallback is None:
            self._note_ran(kp, step.cand.name, declined, {})
            return None
        reason = kp.fallback.reason(why, step.cand.name)
        self.record.note(HistogramKey(kp.key.target, kp.key.op, kp.fallback.winner,
                                      "degraded"), reason, kp.fallback.slowdown(step.cand.name))
        self._note_ran(kp, step.cand.name, declined, {}, reason)
        return kp.degraded

    def _fast_start(self, kp: KeyPlan, inputs: Sequence[Any]
                    ) -> tuple[int, tuple[Callable[..., bool], ...], tuple[str, str] | None]:
        """The step that serves inputs of this signature on the fast path, gated now if
        it was not (-1: the slow path every time); the ``accepts`` of the steps above it
        that declined these inputs, and the first of them with its reason."""
        pre: list[Callable[..., bool]] = []
        first: tuple[str, str] | None = None
        for index, step in enumerate(kp.steps):
            try:
                if step.accepts is not None and not step.accepts(*inputs):
                    pre.append(step.accepts)
                    first = first or (step.cand.name, ACCEPTS_FALSE)
                    continue
            except Exception:
                return -1, (), None  # recorded on each dispatch, by the slow path
            if step.blocked is not None:
                return -1, (), None  # reached by every such dispatch: charged each time
            if self._ungated(kp, step, inputs):
                return index, tuple(pre), first
            kind, reason, _ = self.gates.verdict(kp.op, kp.key, step.cand, inputs)
            if kind == "pass":
                return index, tuple(pre), first
            if kind in ("decline", "decline_inputs"):
                first = first or (step.cand.name, reason)
                held = self.gates.known(kp.op, kp.key, step.cand, inputs)
                if held is not None and held.kind == "pass":
                    # right for the key, raised Decline on these inputs: it stays the fast
                    # step, so inputs of this signature it can run reach it
                    return index, tuple(pre), first
                if held is None:
                    return -1, (), None  # nothing checked yet: gated again on the next inputs
                continue  # it declined the key's own generated inputs: not for this key
            self._note_passed_over(kp, step.cand.name, reason)
            return -1, (), None  # just blocked: charged on the slow path
        return -1, (), None

    # -- explicit gate ----------------------------------------------------------------------

    def gate(self, candidate_name: str, *inputs: Any, seed: int | None = None) -> GateReport:
        """F4-gate one registered candidate on ``inputs`` (and the op's generated inputs)."""
        cand = self.registry.get(candidate_name)
        the_op = self.ops.get(cand.op)
        return f4_gate(cand, the_op, inputs=inputs,
                       seed=self.config.gate_seed if seed is None else seed,
                       call_timeout_s=self.config.call_timeout_s)

    def gate_region(self, candidate_name: str, region: Region,
                    seed: int | None = None) -> GateReport:
        cand = self.registry.get(candidate_name)
        return f4_gate(cand, self.ops.get(cand.op), region=region,
                       seed=self.config.gate_seed if seed is None else seed,
                       call_timeout_s=self.config.call_timeout_s)


def _first_outcome(first: BaseException | bool) -> _Tried:
    """What the fast step already did, as :meth:`Arbiter._try_step` would say it."""
    if first is False:
        return "declined", ACCEPTS_FALSE, None
    if isinstance(first, Decline):
        return "declined", first.reason, None
    return "error", exc_text(first), None  # type: ignore[arg-type]
