"""The F4 accuracy gate: a candidate agrees with the reference within the op's budget."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pytest_arbiter.candidates import Candidate, Decline
from pytest_arbiter.ops import Op, result_dtype, to_host
from pytest_arbiter.regions import Region

GATE_SEED = 20240611


def _shape_text(inputs: Sequence[Any]) -> str:
    return ", ".join("x".join(str(d) for d in np.shape(x)) for x in inputs)


@dataclass(frozen=True)
class TrialResult:
    """One gate input: what ran, and how far from the reference it landed."""

    index: int
    seed: int | None
    shapes: str
    status: str  # "pass", "fail" (out of budget, wrong shape...), "error" (raised), "declined"
    reason: str = ""
    worst_abs: float = 0.0
    worst_rel: float = 0.0
    worst_ratio: float = 0.0  # worst error over its allowed error; > 1 fails


@dataclass(frozen=True)
class GateReport:
    """The gate verdict for one candidate on one region."""

    candidate: str
    op: str
    region: str
    dtype: str
    passed: bool
    reason: str
    worst_abs: float
    worst_rel: float
    worst_ratio: float
    budget: str
    failing: TrialResult | None  # the first trial that failed or raised
    trials: tuple[TrialResult, ...] = field(default_factory=tuple)

    @property
    def error(self) -> str:
        """The first trial's reason in which the candidate raised (or its ``accepts()`` did);
        ``""`` when none did."""
        return next((t.reason for t in self.trials if t.status == "error"), "")

    @property
    def rejected(self) -> bool:
        """Whether the candidate returned a wrong result: out of budget, wrong shape or
        dtype, NaN/Inf, all zeros, or modified inputs (an exception is :attr:`error`)."""
        return any(t.status == "fail" for t in self.trials)

    @property
    def declined_inputs(self) -> bool:
        """Whether the candidate declined the dispatch's own inputs (gated with ``inputs``)."""
        return any(t.index == 0 and t.seed is None and t.status == "declined"
                   for t in self.trials)

    def summary(self) -> str:
        """A readable report: verdict, worst error against budget, failing shape and seed."""
        head = "passed" if self.passed else "FAILED"
        lines = [f"F4 gate {head}: candidate {self.candidate!r} on {self.region}",
                 f"  budget: {self.budget}",
                 f"  worst abs error {self.worst_abs:.3e}, worst rel error {self.worst_rel:.3e}, "
                 f"worst error/allowed {self.worst_ratio:.3g}"]
        if self.failing is not None:
            f = self.failing
            lines.append(
                f"  failing input #{f.index}: shapes {f.shapes}, seed {f.seed}: {f.reason}")
        elif not self.passed:
            lines.append(f"  {self.reason}")
        declined = [t for t in self.trials if t.status == "declined"]
        if declined:
            lines.append(f"  {len(declined)} gate input(s) declined by the candidate "
                         f"(e.g. shapes {declined[0].shapes}: {declined[0].reason})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _budget_text(op: Op, dtype: str) -> str:
    if op.name == "matmul":
        return (f"|C - C_ref| <= 2u|C_ref| + min(K, 8 sqrt K) u_acc (|A||B|) + tiny, "
                f"elementwise, {dtype} (docs/accuracy.md)")
    if op.name == "softmax":
        return (f"|y - y_ref| <= (2u + (8 + 8 sqrt n + |x - max x|) u_acc)|y_ref| + tiny, "
                f"elementwise, {dtype} (docs/accuracy.md)")
    return f"op {op.name!r} budget for {dtype} (docs/accuracy.md)"


def _expected(op: Op, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.dtype]:
    """The float64 ground truth and the dtype the candidate's output must have."""
    if op.builtin:
        return op.exact(*inputs), result_dtype(op, inputs, None)
    ref = np.asarray(to_host(op.reference(*[np.array(x, copy=True) for x in inputs])))
    return ref.astype(np.float64), result_dtype(op, inputs, ref)


Guard = Callable[[], AbstractContextManager[Any]]


def _call_guard(call_timeout_s: float | None) -> Guard:
    """A context manager factory for each candidate call: the watchdog when one is asked
    for and :mod:`pytest_arbiter.watchdog` exists, else nothing."""
    if call_timeout_s is None:
        return contextlib.nullcontext
    try:
        watchdog = importlib.import_module("pytest_arbiter.watchdog").watchdog
    except (ImportError, AttributeError):
        return contextlib.nullcontext
    seconds = call_timeout_s
    return lambda: watchdog(seconds)


def _check_trial(cand: Candidate, op: Op, index: int, seed: int | None,
                 inputs: Sequence[np.ndarray],
                 guard: Guard = contextlib.nullcontext) -> TrialResult:
    shapes = _shape_text(inputs)
    try:
        if not cand.accepts(*inputs):
            return TrialResult(index, seed, shapes, "declined", "accepts() returned False")
    except Exception as exc:
        return TrialResult(index, seed, shapes, "error",
                           f"accepts() raised {type(exc).__name__}: {exc}")
    originals = [np.array(x, copy=True) for x in inputs]
    exact, out_dtype = _expected(op, originals)
    try:
        prepared = cand.prepare_inputs(*[np.array(x, copy=True) for x in inputs])
        with guard():
            raw = cand.run(*prepared)
    except Decline as dec:
        return TrialResult(index, seed, shapes, "declined", f"Decline: {dec.reason}")
    except Exception as exc:
        return TrialResult(index, seed, shapes, "error", f"raised {type(exc).__name__}: {exc}")
    for original, after in zip(originals, prepared, strict=True):
        if not np.array_equal(original, to_host(after), equal_nan=True):
            return TrialResult(index, seed, shapes, "fail", "the kernel modified its inputs")
    out = np.asarray(to_host(raw))
    if out.shape != exact.shape:
        return TrialResult(index, seed, shapes, "fail",
                           f"output shape {out.shape}, reference shape {exact.shape}")
    if out.dtype != out_dtype:
        return TrialResult(index, seed, shapes, "fail",
                           f"output dtype {out.dtype}, expected {out_dtype}")
    got = out.astype(np.float64)
    finite_ref = np.isfinite(exact)
    bad = ~np.isfinite(got) & finite_ref
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        return TrialResult(index, seed, shapes, "fail",
                           f"{int(bad.sum())} NaN/Inf output(s) where the reference is finite, "
                           f"first at {where}")
    if exact.size and not got.any() and exact.any():
        return TrialResult(index, seed, shapes, "fail",
                           "output is all zeros where the reference is not")
    err = np.where(finite_ref, np.abs(got - exact), 0.0)
    allowed = op.budget(originals, exact)
    ratio = err / allowed
    rel = err / np.maximum(np.abs(exact), np.finfo(np.float64).tiny)
    worst_abs = float(err.max()) if err.size else 0.0
    worst_rel = float(rel.max()) if rel.size else 0.0
    worst_ratio = float(ratio.max()) if ratio.size else 0.0
    if worst_ratio > 1.0:
        where = tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
        return TrialResult(index, seed, shapes, "fail",
                           f"error {float(err[where]):.3e} at {where} exceeds the allowed "
                           f"{float(allowed[where]):.3e} ({worst_ratio:.3g}x the budget)",
                           worst_abs, worst_rel, worst_ratio)
    return TrialResult(index, seed, shapes, "pass", "", worst_abs, worst_rel, worst_ratio)


def f4_gate(cand: Candidate, op: Op, *, inputs: Sequence[Any] | None = None,
            region: Region | None = None, seed: int = GATE_SEED,
            call_timeout_s: float | None = None) -> GateReport:
    """Gate ``cand`` on ``inputs`` (if given) and on the op's generated inputs for ``region``.

    Built-in ops generate seeded inputs for the region (the region's own shape, ragged
    neighbours, all-positive and mixed-magnitude values); user ops are gated on the
    dispatch's own inputs. A candidate that declines every input does not pass; one
    that raises does not either (its trial's status is ``"error"``).
    ``call_timeout_s``: run each candidate call under :mod:`pytest_arbiter.watchdog`'s
    ``watchdog(seconds)`` when that module is present; a call it stops is an error.
    """
    guard = _call_guard(call_timeout_s)
    trials: list[tuple[int | None, tuple[np.ndarray, ...]]] = []
    if inputs is not None:
        op.validate(*inputs)
        trials.append((None, tuple(to_host(x) for x in inputs)))
        if region is None:
            region = op.region_of(*inputs)
    if region is None:
        raise ValueError("f4_gate needs inputs or a region")
    if op.gate_inputs is not None:
        generated = op.gate_inputs(region, seed)
        trials.extend((seed + i, t) for i, t in enumerate(generated))
    results = [_check_trial(cand, op, i, s, t, guard) for i, (s, t) in enumerate(trials)]
    checked = [r for r in results if r.status != "declined"]
    failing = next((r for r in results if r.status in ("fail", "error")), None)
    worst = max(checked, key=lambda r: r.worst_ratio, default=None)
    if failing is not None:
        reason = failing.reason
    elif not checked:
        reason = "the candidate declined every gate input, so nothing was checked"
    else:
        reason = ""
    return GateReport(
        candidate=cand.name, op=op.name, region=region.describe(), dtype=region.dtype,
        passed=failing is None and bool(checked), reason=reason,
        worst_abs=max((r.worst_abs for r in checked), default=0.0),
        worst_rel=max((r.worst_rel for r in checked), default=0.0),
        worst_ratio=worst.worst_ratio if worst else 0.0,
        budget=_budget_text(op, region.dtype), failing=failing, trials=tuple(results))
