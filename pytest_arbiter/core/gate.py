"""The F4 gate, the accuracy gate: a candidate agrees with the reference within the op's
budget ("F4" is the gate's name in this project, not an abbreviation)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, NamedTuple

import numpy as np

from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.dtypes import precision, round_to, spacing
from pytest_arbiter.core.ops import ERROR_LAMBDA, ErrorModel, Op, compares_exactly, to_host
from pytest_arbiter.core.regions import Region
from pytest_arbiter.core.trials import (
    SENSITIVE,
    GateTrials,
    PreparedTrial,
    float_name,
    gate_trials,
    host,
)
from pytest_arbiter.core.user_inputs import Pattern, same_layout_copy
from pytest_arbiter.errors import CallTimeout, Decline
from pytest_arbiter.timing.watchdog import CallWatch, watch_session

GATE_SEED = 20240611

NumericFailure = Literal["nonfinite", "overflow", "far_over_budget"]
"""Why a trial failed, when the reason is numerical: NaN where the reference is finite (or
a non-finite value not the reference's), an infinity where it is finite, or an error more
than FAR_OVER_BUDGET times its allowance. A candidate failed so on one key of an op is
gated on the other keys with that trial's pattern (docs/accuracy.md, "Re-gated patterns")."""
FAR_OVER_BUDGET = 100.0


@dataclass(frozen=True)
class TrialResult:
    """One gate input: what ran, and how far from the reference it landed. ``pattern``,
    ``recipe`` and ``regated``: the trial's (:class:`~pytest_arbiter.core.trials.Trial`);
    ``numeric``: why a failed trial failed, when the reason is numerical."""

    index: int
    seed: int | None
    shapes: str
    status: str  # "pass", "fail" (out of budget, wrong shape...), "error" (raised), "declined",
    # "skipped" (a derived input whose exact result is not representable: nothing checked)
    reason: str = ""
    worst_abs: float = 0.0
    worst_rel: float = 0.0
    worst_ratio: float = 0.0  # worst error over its allowed error; > 1 fails
    input: str = ""  # what the input probes: "the dispatch's own inputs", "ragged tails ..."
    bias: float = 0.0  # the bias check's statistic over its bound; > 1 fails (0: not run)
    spread: float = 0.0  # the spread check's statistic over its bound; > 1 fails
    numeric: NumericFailure | None = None
    pattern: str = ""
    recipe: Pattern | None = None
    regated: bool = False
    accepts_false: bool = False  # "declined": the candidate's accepts() returned False


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
        """Whether the candidate returned a wrong result: out of budget, biased or too
        spread out, wrong shape or dtype, NaN/Inf where the reference is finite (or the
        reverse), all zeros, or modified inputs (an exception is :attr:`error`)."""
        return any(t.status == "fail" for t in self.trials)

    @property
    def passed_patterns(self) -> tuple[str, ...]:
        """The patterns of the trials the candidate passed, in order (a skipped or declined
        trial checked nothing: it is not one)."""
        return tuple(dict.fromkeys(t.pattern for t in self.trials if t.status == "pass"))

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
            what = f" ({f.input})" if f.input else ""
            lines.append(f"  failing input #{f.index}{what}: shapes {f.shapes}, "
                         f"seed {f.seed}: {f.reason}")
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
    if op.name == "matmul" and op.builtin:
        tf32 = ", TF32 inputs accepted" if dtype in op.allow_tf32 else ""
        return (f"|C - C_ref| <= half an ulp of C + 8 u_acc (sqrt(K/3) |C_ref| + sqrt(K) "
                f"sqrt((A*A)(B*B))) on generated inputs, 8 sqrt(K) u_acc |A||B| on the "
                f"dispatch's, + flush; bias and spread checks; {dtype}{tf32} "
                f"(docs/accuracy.md)")
    if op.name == "softmax" and op.builtin:
        return (f"|y - y_ref| <= half an ulp of y + u_acc (8 + 2|x - max| + 2 log s "
                f"+ 8 (sqrt n + 5 + 5 sqrt R) + range) |y_ref| + flush; bias and spread "
                f"checks; {dtype} (docs/accuracy.md)")
    return f"op {op.name!r} budget for {dtype} (docs/accuracy.md)"


Guard = Callable[[], AbstractContextManager[Any]]


def _call_guard(call_timeout_s: float | None) -> Guard:
    """A context manager factory for each candidate call: the watchdog when one is asked
    for (in the gate's :func:`watch_session` it only arms and stops the timer), else
    nothing."""
    if call_timeout_s is None:
        return contextlib.nullcontext
    if call_timeout_s <= 0:
        return contextlib.nullcontext  # what watchdog() does with it
    watch = CallWatch(call_timeout_s)  # one object for the gate's calls
    return lambda: watch


STAT_ALPHA = 1e-9
"""False-alarm probability of each statistical check on one gate input (two-sided)."""
_LOG_TERM = math.log(2.0 / STAT_ALPHA)
_MIN_UNITS = 8
"""Fewer distinct outputs than this and the statistical checks say nothing."""
STAT_SAMPLE = 2048
"""The statistical checks look at this many outputs of a trial at most, evenly spread."""
_ROUNDING_VARIANCE = 1.0 / 12.0  # of one rounding to nearest, in ulp^2: the weights' floor
_STAT_DTYPES = ("float32", "float16", "bfloat16")
_FLUSH_MARGIN = 64.0


@dataclass(frozen=True)
class _Units:
    """The sampled outputs of one trial, one entry per distinct (group, exact value), in
    units of the output's spacing (ulp) at the exact value."""

    d: np.ndarray  # got - round(exact): the error beyond a correctly rounded result
    z: np.ndarray  # got - exact
    z_ideal: np.ndarray  # round(exact) - exact: the correctly rounded result's own error
    sign: np.ndarray  # sign of the exact value
    sd: np.ndarray
    common: np.ndarray
    systematic: np.ndarray
    bound: np.ndarray  # the largest |z| the elementwise budget lets through
    group: np.ndarray  # the group (softmax row); each unit its own when nothing is shared


@dataclass(frozen=True)
class _Frame:
    """What the statistical checks compute before they read an output: the sampled
    outputs (positions sorted and grouped, exact values, their spacing and correctly
    rounded values), the units' terms (:class:`_Units` but ``d`` and ``z``) and both
    checks' weights and thresholds (``None`` under _MIN_UNITS units)."""

    index: np.ndarray
    e: np.ndarray
    ulp: np.ndarray
    ideal: np.ndarray
    starts: np.ndarray | None  # where each unit of equal outputs starts; None: one each
    counts: np.ndarray | None
    units: _Units
    bias: tuple[np.ndarray, np.ndarray, float, float, float] | None
    spread: _SpreadTerms | None


def _frame(flat_exact: np.ndarray, flat_got: np.ndarray | None, model: ErrorModel,
           dtype: str, seed: int) -> _Frame:
    """At most STAT_SAMPLE finite outputs, every k-th one (a choice fixed before the errors
    are seen, so the checks' false-alarm bound holds for the sample), and those where
    ``flat_got`` (if given) is finite. Outputs equal in the exact result and in one group
    are one unit: a deterministic kernel computes them alike, so their errors are one
    observation, not several."""
    stride = max(1, -(-flat_exact.size // STAT_SAMPLE))  # an empty output: no units
    index = np.arange(seed % stride, flat_exact.size, stride)
    sampled = flat_exact[index]
    keep = np.isfinite(sampled)
    if flat_got is not None:
        keep &= np.isfinite(flat_got[index])
    gaps = None
    if model.flush:
        # where flushing float32 subnormals to zero (allowed) could move an output by more
        # than 1/64 of its spacing, its error says nothing about rounding
        gaps = spacing(np.where(keep, sampled, 0.0), dtype)
        keep &= gaps >= _FLUSH_MARGIN * model.flush
        gaps = gaps[keep]  # the kept outputs' spacing, made once
    index = index[keep]
    e = sampled[keep]
    # sorted, and equal neighbours found (finite values: equal exactly when their
    # difference is 0)
    if model.group_size:
        groups = index // model.group_size
        order = _by_group_then_value(groups, e)
        groups, e = groups[order], e[order]
        same = (e[1:] == e[:-1]) & (groups[1:] == groups[:-1])
    else:
        order = np.argsort(e)
        e = e[order]
        same = e[1:] == e[:-1]
        groups = np.arange(e.size)
    index = index[order]
    ulp = spacing(e, dtype) if gaps is None else gaps[order]
    ideal = round_to(e, dtype)
    scales = model.scales(index)
    z_ideal = (ideal - e) / ulp
    # one array, each row divided and reduced as it would be alone
    maxima = np.stack([scales.sd, scales.common, scales.systematic,
                       model.allowed.reshape(-1)[index]]) / ulp
    sign = np.sign(e)
    starts = counts = None
    if same.any():
        starts = np.concatenate(([0], np.flatnonzero(~same) + 1))
        counts = np.diff(np.append(starts, e.size))
        z_ideal = np.add.reduceat(z_ideal, starts) / counts
        maxima = np.maximum.reduceat(maxima, starts, axis=1)
        sign, groups = sign[starts], groups[starts]
    sd, common, systematic, bound = maxima
    units = _Units(sign, sign, z_ideal, sign, sd, common, systematic, bound,
                   np.asarray(groups, dtype=np.int64))
    enough = sign.size >= _MIN_UNITS
    return _Frame(index, e, ulp, ideal, starts, counts, units,
                  _bias_terms(units) if enough else None,
                  _spread_terms(units) if enough else None)


def _by_group_then_value(groups: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``np.lexsort((e, groups))`` for finite ``e``, a few times faster: a stable sort of
    complex numbers orders by the real part (the group, exact in float64), then the
    imaginary (the value), ties kept in place."""
    pairs = np.empty(e.size, dtype=np.complex128)
    pairs.real = groups
    pairs.imag = e
    order: np.ndarray = np.argsort(pairs, kind="stable")
    return order


def _units(frame: _Frame, flat_got: np.ndarray) -> _Units:
    """The frame's units with the output's errors, in ulp: ``d`` beyond the correctly
    rounded value, ``z`` from the exact one (averaged over each unit's outputs)."""
    g = flat_got[frame.index]
    d, z = (g - frame.ideal) / frame.ulp, (g - frame.e) / frame.ulp
    if frame.starts is not None:
        d = np.add.reduceat(d, frame.starts) / frame.counts
        z = np.add.reduceat(z, frame.starts) / frame.counts
    u = frame.units  # made field by field: dataclasses.replace costs more than the rest
    return _Units(d, z, u.z_ideal, u.sign, u.sd, u.common, u.systematic, u.bound, u.group)


def _bernstein(variance: float, largest: float) -> float:
    """The deviation a sum of independent zero-mean terms (total variance ``variance``,
    each within ``largest`` of its mean) exceeds with probability at most STAT_ALPHA."""
    return math.sqrt(2.0 * _LOG_TERM * variance) + 2.0 / 3.0 * _LOG_TERM * largest


_total = np.add.reduce
"""``np.sum`` of a 1-D array, without its wrapper (the checks' units are 1-D)."""
_largest = np.maximum.reduce
"""``np.max`` of a 1-D array, likewise."""


def _group_sums(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.bincount(group, weights=values)
    return out


def _bias_terms(u: _Units) -> tuple[np.ndarray, np.ndarray, float, float, float]:
    """The bias check's weights (and times the signs), threshold, allowance and total
    weight: see :func:`_bias_check`."""
    v = u.sd + u.sd ** 2 + u.common + u.systematic
    w = 1.0 / np.maximum(v, _ROUNDING_VARIANCE)
    independent = float(_total(w * w * v))
    shared = float(_total(_group_sums(w * u.common, u.group) ** 2)) if u.common.any() else 0.0
    threshold = _bernstein(independent + shared, float(_largest(2.0 * w * (u.bound + 0.5))))
    return w, w * u.sign, threshold, float(_total(w * u.systematic)), float(_total(w))


def _bias_check(u: _Units, terms: tuple[np.ndarray, np.ndarray, float, float, float]
                ) -> tuple[float, str]:
    """Bias: the weighted mean of ``d`` (signed, and relative to each output's sign) is
    zero for round to nearest, up to the model's systematic allowance and its noise.

    Under the rounding model, E[d] equals the mean shift of the value before the last
    rounding (its position within a spacing being uniform), and
    E[d^2] <= E|c| + E[c^2] for a shift c: so with c of scale sd (independent), common
    (shared by a group) and systematic, Var(d) <= sd + sd^2 + common + systematic.
    """
    w, w_sign, threshold, allowance, total = terms
    worst_ratio, worst_text = 0.0, ""
    for stat, lean in ((float(_total(w_sign * u.d)), ("away from zero", "toward zero")),
                       (float(_total(w * u.d)), ("upward", "downward"))):
        ratio = (abs(stat) - allowance) / threshold
        if ratio > worst_ratio:
            worst_ratio = ratio
            worst_text = (
                f"bias check: the errors lean {lean[0] if stat > 0 else lean[1]}, "
                f"{stat / total:+.3g} ulp on average over {u.d.size} distinct outputs, "
                f"where round to nearest allows {(allowance + threshold) / total:.2g} "
                f"({ratio:.3g}x the bound)")
    return worst_ratio, worst_text


class _SpreadTerms(NamedTuple):
    w: np.ndarray
    fit: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # w h, the groups' fit weight, h
    mean: float
    threshold: float
    total: float


def _spread_terms(u: _Units) -> _SpreadTerms:
    """The spread check's weights, the shared error's fit, the expected statistic, its
    threshold and the total weight: see :func:`_spread_check`."""
    sd2 = u.sd ** 2
    expected = sd2 + u.systematic ** 2
    w = 1.0 / np.maximum(expected, _ROUNDING_VARIANCE)
    reach = u.bound + 0.5
    fit = None
    if u.common.any():
        h = u.common * u.sign
        common2 = u.common ** 2
        fit_w = w * common2
        fit_total = np.maximum(_group_sums(fit_w, u.group), 1e-300)
        fit = (w * h, fit_total, h)
        noise = _group_sums(w * w * common2 * (expected + 0.25), u.group) / fit_total ** 2
        expected = expected + common2 * noise[u.group]
        reach = reach + ERROR_LAMBDA * u.common
    flips = u.sd + sd2 + u.systematic + u.common + expected
    variance = float(_total(w * w * flips * reach ** 2))
    threshold = _bernstein(variance, float(_largest(w * (reach ** 2 + 0.25))))
    return _SpreadTerms(w, fit, float(_total(w * expected)), threshold, float(_total(w)))


def _spread_check(u: _Units, terms: _SpreadTerms) -> tuple[float, str]:
    """Spread: the squared error beyond the correctly rounded result's, z^2 - z_ideal^2,
    has mean E[c^2] <= sd^2 + systematic^2 for a shift c before the last rounding. A
    group's shared relative error is first estimated (least squares, clipped to the
    budget's ERROR_LAMBDA scales) and taken out, its estimation error allowed for."""
    z = u.z
    if terms.fit is not None:
        w_h, fit_w, h = terms.fit
        slope = np.clip(_group_sums(w_h * z, u.group) / fit_w, -ERROR_LAMBDA, ERROR_LAMBDA)
        z = z - slope[u.group] * h
    stat = float(_total(terms.w * (z ** 2 - u.z_ideal ** 2)))
    mean, threshold, total = terms.mean, terms.threshold, terms.total
    ratio = (stat - mean) / threshold
    text = (f"spread check: the errors are {math.sqrt(max(stat, 0.0) / total):.3g} ulp RMS "
            f"beyond correct rounding over {z.size} distinct outputs, where the rounding "
            f"model allows {math.sqrt((mean + threshold) / total):.3g} ({ratio:.3g}x the bound)")
    return ratio, text


def _statistics(got: np.ndarray, exact: np.ndarray, model: ErrorModel, dtype: str,
                seed: int, prep: PreparedTrial | None = None) -> tuple[float, float, str]:
    """``(bias ratio, spread ratio, reason)`` of one trial; a ratio over 1 fails, and the
    reason says which check failed and by how much ("" when both pass). The frame is made
    once for ``prep``'s trial, for outputs finite wherever it samples (an output that is
    not gets a frame of its own)."""
    flat_got = got.reshape(-1)
    frame = prep.checks if prep is not None else None
    if frame is None:
        frame = _frame(exact.reshape(-1), None, model, dtype, seed)
        if prep is not None:
            prep.checks = frame
    if not bool(np.isfinite(flat_got[frame.index]).all()):
        frame = _frame(exact.reshape(-1), flat_got, model, dtype, seed)
    if frame.bias is None or frame.spread is None:
        return 0.0, 0.0, ""
    units = _units(frame, flat_got)
    bias, bias_text = _bias_check(units, frame.bias)
    spread, spread_text = _spread_check(units, frame.spread)
    if bias > 1.0:
        return bias, spread, bias_text
    if spread > 1.0:
        return bias, spread, spread_text
    return bias, spread, ""


_STAT_SOURCES = ("builtin", "generated", "user")


def _check_trial(cand: Candidate, op: Op, index: int, prep: PreparedTrial,
                 guard: Guard) -> TrialResult:
    """Run ``cand`` on one gate input and judge its output (NumPy's floating-point
    warnings off: :func:`evaluate` turns them off once for all the trials)."""
    # the candidate's code, accepts() included, sees copies of the trial's inputs, never
    # the trial's own arrays (shared with the key's other candidates): a write to them
    # fails this candidate alone. The copies keep the inputs' memory layout (strides and
    # all): a kernel wrong on a strided view must fail here, not pass on a contiguous copy
    copies = [same_layout_copy(x) for x in prep.trial.inputs]
    refused = _declined(cand, copies)
    if refused is not None:
        status, reason, accepts_false = refused
        return _result(prep, index, status, reason, accepts_false=accepts_false)
    skip = prep.skip_reason(op)
    if skip:
        return _result(prep, index, "skipped", skip)
    try:
        prepared = cand.prepare_inputs(*copies)
        with guard():
            out, afterwards = _outputs(cand, prepared)
    except Decline as dec:
        return _result(prep, index, "declined", f"Decline: {dec.reason}")
    except (Exception, CallTimeout) as exc:
        return _result(prep, index, "error", f"raised {type(exc).__name__}: {exc}")
    if not _inputs_kept(prep, afterwards):
        return _result(prep, index, "fail", "the kernel modified its inputs")
    assert prep.expected is not None
    exact, out_dtype, _ = prep.expected
    if out.shape != exact.shape:
        return _result(prep, index, "fail",
                       f"output shape {out.shape}, reference shape {exact.shape}")
    if out.dtype != out_dtype:
        return _result(prep, index, "fail", f"output dtype {out.dtype}, expected {out_dtype}")
    # the verdict on an output is a function of its bits and the trial alone: another
    # candidate's identical output is not judged again
    seen = prep.judged_before(out)
    if seen is not None:
        return seen if seen.index == index else replace(seen, index=index)
    if compares_exactly(op, out_dtype):
        judged = _result(prep, index, *_exact_verdict(out, exact))
    else:
        judged = _judge_values(op, index, prep, out)
    prep.remember(out, judged)
    return judged


def _result(prep: PreparedTrial, index: int, status: str, reason: str = "",
            **values: Any) -> TrialResult:
    """A trial's result: what ran (``prep``'s trial, as the ``index``-th) and the verdict."""
    trial = prep.trial
    return TrialResult(index, trial.seed, prep.shapes, status, reason, input=trial.name,
                       pattern=trial.pattern, recipe=trial.recipe, regated=trial.regated,
                       **values)


def _declined(cand: Candidate, inputs: Sequence[Any]) -> tuple[str, str, bool] | None:
    """``(status, reason, whether accepts() returned False)`` when ``accepts()`` refuses
    the inputs or raises; else None."""
    try:
        if not cand.accepts(*inputs):
            return "declined", "accepts() returned False", True
    except Decline as dec:
        return "declined", f"Decline: {dec.reason}", False
    except Exception as exc:
        return "error", f"accepts() raised {type(exc).__name__}: {exc}", False
    return None


def _outputs(cand: Candidate, prepared: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
    """The candidate's output and its inputs after the run, on the host (the copies back
    wait for a device candidate's work: under the watchdog, so a fault or a hang there is
    this candidate's, never escapes nor blames the next)."""
    out = np.asarray(to_host(cand.run(*prepared)))
    return out, [x if type(x) is np.ndarray else host(x) for x in prepared]


def _inputs_kept(prep: PreparedTrial, afterwards: Sequence[Any]) -> bool:
    """Whether the kernel's inputs are after its run as they were copied: compared with
    the trial's own copies directly, no copy of the kernel's taken before the run."""
    count = len(prep.originals())
    if len(afterwards) != count:
        raise ValueError(f"{len(afterwards)} inputs after the run, {count} before")
    return all(prep.unchanged(i, after) for i, after in enumerate(afterwards))


def _exact_verdict(out: np.ndarray, exact: np.ndarray) -> tuple[str, str]:
    """An integer or boolean output: equal to the reference's, element for element."""
    wrong = out.astype(np.float64) != exact
    if not wrong.any():
        return "pass", ""
    where = tuple(int(i) for i in np.argwhere(wrong)[0])
    return "fail", (f"{int(wrong.sum())} output(s) differ from the reference's exact "
                    f"{out.dtype} values, first at {where}: got {out[where]}, reference "
                    f"{exact[where]:g} (integer and boolean outputs are compared exactly)")


def _judge_values(op: Op, index: int, prep: PreparedTrial, out: np.ndarray) -> TrialResult:
    """A floating-point output against the reference: non-finite values, the elementwise
    budget, and on the gate's own random inputs the bias and spread checks."""
    trial = prep.trial
    assert prep.expected is not None
    exact = prep.expected[0]
    got = out.astype(np.float64)
    out_float = float_name(out.dtype)
    facts = prep.facts()
    wrong, numeric, checked = _non_finite(got, exact, out_float, facts.finite)
    if wrong:
        return _result(prep, index, "fail", wrong, numeric=numeric)
    if facts.nonzero and not got.any():
        return _result(prep, index, "fail", "output is all zeros where the reference is not")
    model, allowed = prep.budget_for(op, out_float)
    err = np.subtract(got, exact)
    np.abs(err, out=err)
    if checked is not None:
        err = np.where(checked, err, 0.0)
    ratio = err / allowed  # (floating-point warnings are off in the trial)
    if model is None or trial.source in SENSITIVE:
        ratio = np.where(err > 0, ratio, 0.0)  # a user budget may allow 0 somewhere
    worst_ratio = float(ratio.max()) if ratio.size else 0.0
    worst_abs = float(err.max()) if err.size else 0.0
    # |exact| >= tiny or the error is 0 (where it is not checked): the relative error
    # is 0 where the absolute one is
    worst_rel = float((err / facts.scale).max()) if err.size else 0.0
    if worst_ratio > 1.0:
        where = tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
        return _result(
            prep, index, "fail",
            f"error {float(err[where]):.3e} at {where} exceeds the allowed "
            f"{float(allowed[where]):.3e} ({worst_ratio:.3g}x the budget)",
            worst_abs=worst_abs, worst_rel=worst_rel, worst_ratio=worst_ratio,
            numeric="far_over_budget" if worst_ratio > FAR_OVER_BUDGET else None)
    bias = spread = 0.0
    why = ""
    if (model is not None and trial.seed is not None and out_float in _STAT_DTYPES
            and trial.source in _STAT_SOURCES):
        # the checks' null model holds for random inputs only; the dispatch's inputs may
        # be structured (equal rows, sorted values) and make a correct kernel's rounding
        # errors look biased, and offsets and specials add errors of their own
        sample = got if checked is None else np.where(checked, got, np.nan)
        bias, spread, why = _statistics(sample, exact, model, out_float, trial.seed, prep)
    return _result(prep, index, "fail" if why else "pass", why, worst_abs=worst_abs,
                   worst_rel=worst_rel, worst_ratio=worst_ratio, bias=bias, spread=spread)


def _non_finite(got: np.ndarray, exact: np.ndarray, out_float: str | None,
                finite: np.ndarray | None = None
                ) -> tuple[str, NumericFailure | None, np.ndarray | None]:
    """Where the reference defines a NaN, the output must be NaN; where it defines an
    infinity, that infinity or NaN (compensated and Strassen-like sums turn ``inf - inf``
    into NaN); where it is finite, a finite value, unless rounding the exact value to the
    output dtype overflows (then that infinity is right). A non-finite value must never
    come back finite. ``(what is wrong or "", its category, the outputs to hold to the
    budget)``, the mask ``None`` when that is all of them. ``finite``: where ``exact`` is
    finite, ``None`` when it is everywhere (computed here when not given)."""
    if finite is None and not bool(np.isfinite(exact).all()):
        finite = np.isfinite(exact)
    if bool(np.isfinite(got).all()):
        if finite is None:
            return "", None, None
    elif finite is None:
        finite = np.ones(exact.shape, dtype=bool)
    overflowed = np.zeros(exact.shape, dtype=bool)
    if out_float is not None:
        big = finite & (np.abs(np.where(finite, exact, 0.0)) > precision(out_float).largest)
        if big.any():
            rounded = round_to(np.where(big, exact, 0.0), out_float)
            overflowed = big & np.isinf(rounded) & (got == rounded)
    checks = (
        (finite & ~np.isfinite(got) & ~overflowed,
         "NaN/Inf output(s) where the reference is finite"),
        (np.isnan(exact) & ~np.isnan(got),
         "output(s) not NaN where the reference is NaN (a NaN, 0 * inf or inf - inf "
         "must propagate)"),
        (np.isinf(exact) & (got != exact) & ~np.isnan(got),
         "output(s) neither NaN nor the reference's infinity where it is infinite"),
    )
    for number, (bad, what) in enumerate(checks):
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            overflow = number == 0 and bool(np.isinf(got[bad]).any())
            return (f"{int(bad.sum())} {what}, first at {where}: got {float(got[where]):g}, "
                    f"reference {float(exact[where]):g}"), (
                        "overflow" if overflow else "nonfinite"), None
    return "", None, finite & ~overflowed


def _nothing_checked(op: Op, trials: Sequence[PreparedTrial],
                     results: Sequence[TrialResult]) -> str:
    """Why a gate with no failure still does not pass: no trial at all (a user op gated on
    a region, with no inputs to start from), or every trial declined or skipped."""
    if not trials:
        return (f"nothing to check: op {op.name!r} is a user op, whose gate inputs are made "
                "from a dispatch's inputs; gate the candidate on inputs "
                "(arbiter.gate(name, *inputs)), not on a region alone")
    if any(r.status == "declined" for r in results):
        return "the candidate declined every gate input, so nothing was checked"
    return "every gate input was skipped, so nothing was checked"


def evaluate(cand: Candidate, op: Op, *, inputs: Sequence[Any] | None = None,
             region: Region | None = None, seed: int = GATE_SEED,
             call_timeout_s: float | None = None,
             trials: GateTrials | None = None,
             regate: Sequence[Pattern] = ()) -> GateReport:
    """Gate ``cand`` on ``inputs`` (if given) and on the op's generated inputs for ``region``.

    Built-in ops generate seeded inputs for the region (its own shape, ragged neighbours
    and tails, all-positive, mixed-magnitude and offset values, zeros, NaN/inf and
    subnormals: docs/accuracy.md); on those, besides the elementwise budget, the errors
    must pass a bias and a spread check. User ops are gated on the dispatch's own inputs,
    on the op's ``gate_inputs(inputs, rng)`` if it has one, and on trials derived from
    the dispatch's inputs (fresh values, large magnitudes and offsets, special values);
    the statistical checks run on the random ones (docs/accuracy.md, "User ops").
    A candidate that declines every input does not pass; one that raises does not either
    (its trial's status is ``"error"``).
    ``call_timeout_s``: run each candidate call under the watchdog (its handler installed
    once for the gate, its timer armed for each call); a call it stops is an error. ``trials``:
    :func:`gate_trials` of these inputs, region and seed, shared with the other
    candidates gated on them (the inputs, the reference's results and the budgets are
    then made once). ``regate``: derived trials' patterns that failed this candidate on
    another key of the op, made again for these inputs' shapes and run after the rest
    (:meth:`~pytest_arbiter.core.trials.GateTrials.regated`).
    Tells no hook: the public ``f4_gate`` (``decision.gating``) does.
    """
    if trials is None:
        trials = gate_trials(op, inputs=inputs, region=region, seed=seed)
    elif trials.op is not op or trials.seed != seed:
        raise ValueError(f"gate trials prepared for op {trials.op.name!r}, seed "
                         f"{trials.seed}: not for op {op.name!r}, seed {seed}")
    region = trials.region
    guard = _call_guard(call_timeout_s)
    prepared = (*trials.trials, *trials.regated(regate)) if regate else trials.trials
    # NumPy's floating-point warnings off: the gate feeds NaN, inf and subnormals on
    # purpose, and a kernel's ``0 * inf`` is its output's business, not an error (under
    # ``filterwarnings = error`` a warning would be raised as one)
    with watch_session(call_timeout_s), np.errstate(all="ignore"):
        # the watchdog's handler installed once, not per call
        results = [_check_trial(cand, op, i, t, guard) for i, t in enumerate(prepared)]
    trials.settle()
    checked = [r for r in results if r.status not in ("declined", "skipped")]
    failing = next((r for r in results if r.status in ("fail", "error")), None)
    worst = max(checked, key=lambda r: r.worst_ratio, default=None)
    if failing is not None:
        reason = failing.reason
    elif not checked:
        reason = _nothing_checked(op, prepared, results)
    else:
        reason = ""
    report = GateReport(
        candidate=cand.name, op=op.name, region=region.describe(), dtype=region.dtype,
        passed=failing is None and bool(checked), reason=reason,
        worst_abs=max((r.worst_abs for r in checked), default=0.0),
        worst_rel=max((r.worst_rel for r in checked), default=0.0),
        worst_ratio=worst.worst_ratio if worst else 0.0,
        budget=_budget_text(op, region.dtype), failing=failing, trials=tuple(results))
    return report
