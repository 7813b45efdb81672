"""The F4 gate as the decision core uses it: one typed verdict per candidate, key and
layout of the inputs, memoised for the process.

Lead-safety: a candidate runs for a dispatch key only after it passed the gate for that
key and layout in this process (or, with the gate off, the corpus vouches for its code);
a ``reject`` or ``error`` holds for the whole key.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.gate import GATE_SEED, GateReport, evaluate
from pytest_arbiter.core.ops import Op
from pytest_arbiter.core.regions import Region
from pytest_arbiter.core.trials import GateTrials, gate_trials
from pytest_arbiter.decision.states import DispatchKey, GateKind
from pytest_arbiter.extend.hooks import call as call_hook


def f4_gate(cand: Candidate, op: Op, *, inputs: Sequence[Any] | None = None,
            region: Region | None = None, seed: int = GATE_SEED,
            call_timeout_s: float | None = None,
            trials: GateTrials | None = None) -> GateReport:
    """The F4 gate (:func:`pytest_arbiter.core.gate.evaluate`: ``cand`` on ``inputs`` and
    on the op's generated inputs for ``region``; ``trials``: those, prepared once for
    the candidates gated on them), telling the hooks of a candidate that was wrong or
    raised (``pytest_arbiter_gate_failed``); declining every input is not a failure."""
    report = evaluate(cand, op, inputs=inputs, region=region, seed=seed,
                      call_timeout_s=call_timeout_s, trials=trials)
    if report.failing is not None:
        call_hook("pytest_arbiter_gate_failed", report=report)
    return report


class Verdict(NamedTuple):
    """The gate's verdict on one candidate, and the reason for people."""

    kind: GateKind
    reason: str = ""


PASS = Verdict("pass")


def verdict_of(report: GateReport) -> Verdict:
    """One gate report as a :class:`Verdict`."""
    if report.error:
        return Verdict("error", f"in the F4 gate: {report.error}")
    if report.rejected:
        return Verdict("reject", f"failed the F4 gate: {_gate_line(report)}")
    if not report.passed:
        return Verdict("decline",
                       _decline_text(report) or report.reason or "declined every gate input")
    if report.declined_inputs:
        return Verdict("decline_inputs", _decline_text(report))
    return PASS


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


class SharedTrials:
    """The gate trials last prepared, for the next candidate gated on the same op, inputs,
    region and seed: the trials, their reference results and budgets are the same for
    every candidate, so a key's candidates share them (one slot: a key's candidates are
    gated one after the other). The trials hold the caller's inputs, copies of them and
    the reference's results: :meth:`release` them once the candidates are gated."""

    def __init__(self) -> None:
        self._last: GateTrials | None = None

    def get(self, op: Op, inputs: Sequence[Any], region: Region, seed: int) -> GateTrials:
        """The trials of ``op`` on ``inputs`` and ``region``: the last ones if they hold
        for these (:meth:`~pytest_arbiter.core.trials.GateTrials.holds_for`), else new."""
        last = self._last
        if last is not None and last.holds_for(op, inputs, region, seed):
            return last
        self._last = made = gate_trials(op, inputs=inputs, region=region, seed=seed)
        return made

    def release(self) -> None:
        """Drop the trials held (the inputs, their copies, the reference's results)."""
        self._last = None


MemoKey = tuple[DispatchKey, str, tuple[str, ...]]


@dataclass(eq=False)
class _Held:
    cand: Candidate  # the verdict holds for this object: a re-registered name is gated again
    verdict: Verdict


class GateMemo:
    """Per-process verdicts, keyed by (dispatch key, candidate, layout of the inputs).

    ``on_block`` is called with the key when a candidate is rejected or errors for it
    (the arbiter drops the key's plans)."""

    def __init__(self, seed: int, call_timeout_s: float | None,
                 on_block: Callable[[DispatchKey], None]) -> None:
        self.seed = seed
        self.call_timeout_s = call_timeout_s
        self._held: dict[MemoKey, _Held] = {}
        self._on_block = on_block
        self._lock = threading.Lock()
        self._trials = SharedTrials()
        self.passed: set[tuple[str, str, str]] = set()
        """(target, op, candidate) that passed the gate for some key in this process."""
        self.failed: set[tuple[str, str, str]] = set()
        """(target, op, candidate) that failed it (``reject`` or ``error``) for some key."""

    def release_trials(self) -> None:
        """Drop the trials the last gate calls shared (a plan, or a dispatch's slow path,
        has gated what it needed): they hold the inputs and many times their size."""
        self._trials.release()

    def known(self, key: DispatchKey, cand: Candidate, inputs: Sequence[Any]) -> Verdict | None:
        """The verdict already held for ``cand`` on these inputs' layout, if any."""
        held = self._held.get((key, cand.name, layout(inputs)))
        return held.verdict if held is not None and held.cand is cand else None

    def known_bad(self, key: DispatchKey, cand: Candidate, inputs: Sequence[Any]) -> bool:
        found = self.known(key, cand, inputs)
        return found is not None and found.kind in ("reject", "error")

    def verdict(self, op: Op, key: DispatchKey, cand: Candidate,
                inputs: Sequence[Any]) -> Verdict:
        """The verdict on ``cand`` for ``key`` and these inputs, gated now if unknown."""
        found = self.known(key, cand, inputs)
        if found is not None:
            return found
        region = op.region_of(*inputs)
        report = f4_gate(cand, op, inputs=inputs, region=region, seed=self.seed,
                         call_timeout_s=self.call_timeout_s,
                         trials=self._trials.get(op, inputs, region, self.seed))
        found = verdict_of(report)
        self._remember(op, key, cand, inputs, found)
        return found

    def _remember(self, op: Op, key: DispatchKey, cand: Candidate, inputs: Sequence[Any],
                  found: Verdict) -> None:
        memo_key = (key, cand.name, layout(inputs))
        triple = (key.target, key.op, cand.name)
        if found.kind in ("reject", "error"):
            with self._lock:
                self._held[memo_key] = _Held(cand, found)
                self.failed.add(triple)
            self._on_block(key)
        elif found.kind in ("pass", "decline_inputs"):
            # right for the key: later inputs of this layout run it (a decline of theirs
            # is the dispatch's to handle)
            with self._lock:
                self._held[memo_key] = _Held(cand, PASS)
                self.passed.add(triple)
        elif op.gate_inputs is not None:
            # it declined the key's own generated inputs too: not run for this layout
            with self._lock:
                self._held[memo_key] = _Held(cand, found)
        # a user op's decline checked nothing: gated again on the next inputs


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
