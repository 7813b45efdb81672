"""The F4 gate as the decision core uses it: one typed verdict per candidate, key and
layout of the inputs, memoised for the process.

Lead-safety: a candidate runs for a dispatch key only after it passed the gate for that
key and layout in this process (a user op's, with the gate on: for those shapes too), or
with the gate off, the corpus vouches for its code; a ``reject`` or ``error`` holds for
the whole key and layout. A candidate rejected for a numerical
reason on one key of an op (:data:`~pytest_arbiter.core.gate.NumericFailure`) is gated
on every other key of the op before it runs there, gate or no gate, and on those of a
user op with the failing derived trial's pattern made for that key's shapes; its passes
held for the other keys are dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.gate import GATE_SEED, GateReport, NumericFailure, TrialResult, evaluate
from pytest_arbiter.core.ops import Op
from pytest_arbiter.core.regions import Region
from pytest_arbiter.core.trials import GateTrials, gate_trials
from pytest_arbiter.core.user_inputs import Pattern
from pytest_arbiter.decision.states import DispatchKey, GateKind
from pytest_arbiter.extend.hooks import call as call_hook


def f4_gate(cand: Candidate, op: Op, *, inputs: Sequence[Any] | None = None,
            region: Region | None = None, seed: int = GATE_SEED,
            call_timeout_s: float | None = None,
            trials: GateTrials | None = None, regate: Sequence[Pattern] = ()) -> GateReport:
    """The F4 gate (:func:`pytest_arbiter.core.gate.evaluate`: ``cand`` on ``inputs`` and
    on the op's generated inputs for ``region``; ``trials``: those, prepared once for
    the candidates gated on them; ``regate``: patterns that failed it on other keys),
    telling the hooks of a candidate that was wrong or raised
    (``pytest_arbiter_gate_failed``); declining every input is not a failure."""
    report = evaluate(cand, op, inputs=inputs, region=region, seed=seed,
                      call_timeout_s=call_timeout_s, trials=trials, regate=regate)
    if report.failing is not None:
        call_hook("pytest_arbiter_gate_failed", report=report)
    return report


class Verdict(NamedTuple):
    """The gate's verdict on one candidate, the reason for people, and the patterns of
    the trials it passed (:attr:`~pytest_arbiter.core.gate.GateReport.passed_patterns`:
    what a cache entry records of it)."""

    kind: GateKind
    reason: str = ""
    trials: tuple[str, ...] = ()


PASS = Verdict("pass")


def verdict_of(report: GateReport) -> Verdict:
    """One gate report as a :class:`Verdict`."""
    erring = next((t for t in report.trials if t.status == "error"), None)
    if erring is not None:
        return Verdict("error", f"in the F4 gate, on {_where(erring)}: {erring.reason}"
                                f"{_domain_hint(erring)}")
    if report.rejected:
        again = (" on a pattern that failed it on another key of the op"
                 if report.failing is not None and report.failing.regated else "")
        return Verdict("reject", f"failed the F4 gate{again}: {_gate_line(report)}")
    if not report.passed:
        return Verdict("decline",
                       _decline_text(report) or report.reason or "declined every gate input")
    if report.declined_inputs:
        return Verdict("decline_inputs", _decline_text(report), report.passed_patterns)
    return Verdict("pass", "", report.passed_patterns)


def _decline_text(report: GateReport) -> str:
    """The reason the dispatch's own inputs were declined (trial 0), if they were."""
    first = report.trials[0] if report.trials else None
    if first is None or first.seed is not None or first.status != "declined":
        return ""
    return first.reason.removeprefix("Decline: ")


def _gate_line(report: GateReport) -> str:
    """One line: what failed, how far out of budget, on which input and seed."""
    failing = report.failing
    return f"{report.reason} (on {_where(failing)})" if failing else report.reason


def _where(trial: TrialResult) -> str:
    """Which gate input: its number, what it probes, its shapes and (a generated one)
    its seed."""
    what = f"{trial.input}: " if trial.input else ""
    seed = "" if trial.seed is None else f", seed {trial.seed}"
    return f"input #{trial.index} ({what}{trial.shapes}{seed})"


def _domain_hint(trial: TrialResult) -> str:
    """For a user op's trial derived from the dispatch's inputs (fresh values, large
    magnitudes or offsets, special values) that the candidate raised on: how to say the
    inputs are outside the op's domain."""
    if trial.recipe is None:  # not a derived trial
        return ""
    return ("; if such inputs are outside the op's domain, make its reference (or "
            "validate) raise on them and the trial is skipped (docs/accuracy.md, "
            "\"User ops: the gate's inputs\")")


class SharedTrials:
    """The gate trials last prepared, for the next candidate gated on the same op, inputs,
    region and seed: the trials, their reference results and budgets are the same for
    every candidate, so a key's candidates share them (one slot: a key's candidates are
    gated one after the other). The trials hold the caller's inputs, copies of them and
    the reference's results: :meth:`release` them once the candidates are gated."""

    def __init__(self) -> None:
        self._last: GateTrials | None = None

    def get(self, op: Op, inputs: Sequence[Any], region: Region | None,
            seed: int) -> GateTrials:
        """The trials of ``op`` on ``inputs`` and ``region`` (``None``: the inputs'): the
        last ones if they hold for these
        (:meth:`~pytest_arbiter.core.trials.GateTrials.holds_for`), else new."""
        last = self._last
        if last is not None and last.holds_for(op, inputs, region, seed):
            return last
        self._last = made = gate_trials(op, inputs=inputs, region=region, seed=seed)
        return made

    def release(self) -> None:
        """Drop the trials held (the inputs, their copies, the reference's results)."""
        self._last = None


MemoKey = tuple[DispatchKey, str, tuple[Any, ...]]
Triple = tuple[str, str, str]
"""(target, op, candidate)."""


@dataclass(eq=False)
class _Held:
    cand: Candidate  # the verdict holds for this object: a re-registered name is gated again
    op: Op  # and this definition of the op: a replaced one (its budget) gates again
    verdict: Verdict


class Failure(NamedTuple):
    """A candidate's numerical rejection on one key: the key, why, and the failing derived
    trial's pattern (``None``: a trial each key's gate makes of its own, the dispatch's
    inputs, the op's ``gate_inputs``' or a built-in op's generated ones)."""

    key: DispatchKey
    numeric: NumericFailure
    recipe: Pattern | None


class GateMemo:
    """Per-process verdicts, keyed by (dispatch key, candidate, what the verdict holds
    for: :func:`gated_as`), and
    the candidates' numerical rejections per (target, op, candidate) (:class:`Failure`).

    ``on_block`` is called with the key when a candidate is rejected or errors for it,
    and with each key whose pass a numerical rejection elsewhere dropped (the arbiter
    drops the key's plans); ``on_suspect`` with (target, op) at a candidate's first
    numerical rejection, or one with a new pattern (the arbiter drops the plans of
    every key of the op, where a step the corpus vouches for may run ungated)."""

    def __init__(self, seed: int, call_timeout_s: float | None,
                 on_block: Callable[[DispatchKey], None],
                 on_suspect: Callable[[str, str], None] | None = None, *,
                 per_shape: bool = True) -> None:
        self.seed = seed
        self.per_shape = per_shape
        """A user op's verdicts held per shapes too (:func:`gated_as`)."""
        self.call_timeout_s = call_timeout_s
        self._held: dict[MemoKey, _Held] = {}
        self._on_block = on_block
        self._on_suspect = on_suspect
        self._lock = threading.Lock()
        self._trials = SharedTrials()
        self.passed: set[Triple] = set()
        """(target, op, candidate) that passed the gate for some key in this process."""
        self.failed: set[Triple] = set()
        """(target, op, candidate) that failed it (``reject`` or ``error``) for some key."""
        self.failures: dict[Triple, list[Failure]] = {}
        """The numerical rejections of each (target, op, candidate), in order."""

    def release_trials(self) -> None:
        """Drop the trials the last gate calls shared (a plan, or a dispatch's slow path,
        has gated what it needed): they hold the inputs and many times their size."""
        self._trials.release()

    def known(self, op: Op, key: DispatchKey, cand: Candidate,
              inputs: Sequence[Any]) -> Verdict | None:
        """The verdict already held for ``cand`` on inputs like these, if any: a reject
        or an error for the key and layout, else a pass for inputs like these
        (:func:`gated_as`: a user op's, of these shapes too)."""
        held = self._held.get((key, cand.name, layout(inputs)))
        if held is None or held.verdict.kind not in ("reject", "error"):
            held = self._held.get((key, cand.name, gated_as(op, inputs, self.per_shape)))
        if held is None or held.cand is not cand or held.op is not op:
            return None
        return held.verdict

    def known_bad(self, op: Op, key: DispatchKey, cand: Candidate,
                  inputs: Sequence[Any]) -> bool:
        found = self.known(op, key, cand, inputs)
        return found is not None and found.kind in ("reject", "error")

    def suspect(self, key: DispatchKey, cand: Candidate) -> bool:
        """Whether ``cand`` failed the gate for a numerical reason on another key of
        ``key``'s op in this process: it is gated for ``key`` before it runs, gate or no."""
        return any(f.key != key for f in self.failures.get(_triple(key, cand), ()))

    def regate(self, key: DispatchKey, cand: Candidate) -> tuple[Pattern, ...]:
        """The derived trials' patterns that failed ``cand`` on other keys of the op: one
        per kind and input (the first seen), however many keys it failed on."""
        first: dict[tuple[str, int], Pattern] = {}
        for f in self.failures.get(_triple(key, cand), ()):
            if f.key != key and f.recipe is not None:
                first.setdefault((f.recipe.kind, f.recipe.input), f.recipe)
        return tuple(first.values())

    def verdict(self, op: Op, key: DispatchKey, cand: Candidate,
                inputs: Sequence[Any]) -> Verdict:
        """The verdict on ``cand`` for ``key`` and these inputs, gated now if unknown (with
        the patterns that failed it on the op's other keys: :meth:`regate`)."""
        found = self.known(op, key, cand, inputs)
        if found is not None:
            return found
        # the trials' region is the inputs' (made from them when the trials are)
        report = f4_gate(cand, op, inputs=inputs, seed=self.seed,
                         call_timeout_s=self.call_timeout_s,
                         trials=self._trials.get(op, inputs, None, self.seed),
                         regate=self.regate(key, cand))
        found = verdict_of(report)
        if found.kind == "reject" and report.failing is not None and report.failing.regated:
            found = found._replace(reason=f"{found.reason}; {self._origin(key, cand, report)}")
        self._remember(op, key, cand, inputs, found)
        if found.kind == "reject":
            self._note_failure(key, cand, report)
        return found

    def _origin(self, key: DispatchKey, cand: Candidate, report: GateReport) -> str:
        """Where the re-gated pattern that failed ``cand`` here first failed it."""
        recipe = report.failing.recipe if report.failing is not None else None
        kind = recipe.kind if recipe is not None else ""
        first = next((f for f in self.failures.get(_triple(key, cand), ())
                      if f.recipe is not None and f.recipe.kind == kind), None)
        where = f"bucket {first.key.bucket}, {first.key.dtype}" if first else "another key"
        return f"the {kind} pattern first failed it on {where}"

    def _remember(self, op: Op, key: DispatchKey, cand: Candidate, inputs: Sequence[Any],
                  found: Verdict) -> None:
        memo_key = (key, cand.name, gated_as(op, inputs, self.per_shape))
        triple = _triple(key, cand)
        if found.kind in ("reject", "error"):
            memo_key = (key, cand.name, layout(inputs))  # for the whole key and layout
            with self._lock:
                self._held[memo_key] = _Held(cand, op, found)
                self.failed.add(triple)
            self._on_block(key)
        elif found.kind in ("pass", "decline_inputs"):
            # right for the key: later inputs of this layout run it (a decline of theirs
            # is the dispatch's to handle)
            with self._lock:
                self._held[memo_key] = _Held(cand, op, found._replace(kind="pass", reason=""))
                self.passed.add(triple)
        elif op.gate_inputs is not None:
            # it declined the key's own generated inputs too: not run for this layout
            with self._lock:
                self._held[memo_key] = _Held(cand, op, found)
        # a user op's decline checked nothing: gated again on the next inputs

    def _note_failure(self, key: DispatchKey, cand: Candidate, report: GateReport) -> None:
        """Keep a numerical rejection; a pattern new for the candidate drops its passes
        held for the op's other keys (each is gated again, with the pattern, at its next
        dispatch)."""
        failing = report.failing
        if failing is None or failing.numeric is None:
            return
        triple = _triple(key, cand)
        recipe = None if failing.regated else failing.recipe
        with self._lock:
            known = self.failures.setdefault(triple, [])
            first = not known
            new = recipe is not None and all(
                f.recipe is None or (f.recipe.kind, f.recipe.input) != (recipe.kind, recipe.input)
                for f in known)
            known.append(Failure(key, failing.numeric, recipe))
            dropped = [k for k, held in self._held.items() if new and k[1] == cand.name
                       and k[0] != key and k[0][:2] == key[:2] and held.verdict.kind == "pass"]
            for memo_key in dropped:
                del self._held[memo_key]
        for other in dict.fromkeys(k[0] for k in dropped):
            self._on_block(other)
        if (first or new) and self._on_suspect is not None:
            self._on_suspect(key.target, key.op)


def _triple(key: DispatchKey, cand: Candidate) -> Triple:
    return (key.target, key.op, cand.name)


def gated_as(op: Op, inputs: Sequence[Any], per_shape: bool = True) -> tuple[Any, ...]:
    """What a verdict of the gate holds for: inputs of this layout (:func:`layout`), and
    for a user op (``per_shape``: with the gate on) of these exact shapes too. A built-in
    op's generated trials cover its key's ragged tails; a user op's derived trials keep
    the dispatch's shapes, so a kernel wrong only when ``n % 8 == 7`` is gated on each
    length a test gives it."""
    if op.builtin or not per_shape:
        return layout(inputs)
    return (*layout(inputs), *(tuple(getattr(x, "shape", ())) for x in inputs))


def layout(inputs: Sequence[Any]) -> tuple[str, ...]:
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
