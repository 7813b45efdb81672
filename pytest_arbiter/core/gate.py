"""The F4 gate, the accuracy gate: a candidate agrees with the reference within the op's
budget ("F4" is the gate's name in this project, not an abbreviation)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np

from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.dtypes import precision, round_to
from pytest_arbiter.core.gate_stats import (
    STAT_DTYPES,
    STAT_SAMPLE as STAT_SAMPLE,  # re-exported: read as the gate's
    FrameRequest,
    _by_group_then_value as _by_group_then_value,
    _frame as _frame,
    _statistics,
    frames,
)
from pytest_arbiter.core.nan_origin import limit_signs
from pytest_arbiter.core.ops import ErrorModel, Op, compares_exactly, to_host
from pytest_arbiter.core.ops.arrays import OutputForm, output_form
from pytest_arbiter.core.regions import Region
from pytest_arbiter.core.trials import (
    SENSITIVE,
    GateTrials,
    PreparedTrial,
    float_name,
    gate_trials,
    host,
    host_copy,
    reference_values,
)
from pytest_arbiter.core.user_inputs import Pattern, same_layout_copy, sensitivity
from pytest_arbiter.errors import CallTimeout, Decline
from pytest_arbiter.timing.watchdog import CallWatch, watch_session

GATE_SEED = 20240611

NumericFailure = Literal["nonfinite", "overflow", "far_over_budget"]
"""Why a trial failed, when the reason is numerical: NaN where the reference is finite (or
a non-finite value not the reference's), an infinity where it is finite, or an error more
than FAR_OVER_BUDGET times its allowance. A candidate failed so on one key of an op is
gated on the other keys with that trial's pattern (docs/accuracy.md, "Re-gated patterns")."""
FAR_OVER_BUDGET = 100.0
FailureKind = Literal["structure", "inputs_modified", "shape", "dtype", "values",
                      "nondeterministic"]
"""What a failed trial got wrong: how the output is packed (a tuple where the reference
returns one array, another number of outputs, a list for a tuple), the inputs (written
to), the output's shape or dtype, its values (out of budget, non-finite, all zeros,
biased or spread out, an integer off), or its repeatability (right on one call, wrong on
a later call on the same input: a race, an uninitialised buffer; :data:`REPEATS`)."""
REPEATS = 2
"""After its trials, a candidate that passed them all runs this many more times on one of
them (the dispatch's own inputs; on a region alone, the smallest): each output must be the
first one's bits or, where it differs, within the budget on its own (docs/accuracy.md,
"Repeated calls")."""


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
    failure: FailureKind | None = None  # "fail": what the output got wrong


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
            seed = "" if f.seed is None else f", seed {f.seed}"
            lines.append(f"  failing input #{f.index}{what}: shapes {f.shapes}{seed}: "
                         f"{f.reason}")
        elif not self.passed:
            lines.append(f"  {self.reason}")
        skipped = [t for t in self.trials if t.status == "skipped"]
        if skipped:
            lines.append(f"  {len(skipped)} of {len(self.trials)} gate inputs checked "
                         f"nothing (e.g. {skipped[0].input or skipped[0].pattern}: "
                         f"{skipped[0].reason})")
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




_STAT_SOURCES = ("builtin", "generated", "user")


@dataclass(eq=False)
class _Pending:
    """A trial whose output passed every check but the statistical ones: what their
    verdict needs (the output in float64, NaN where it is not checked; the model; the
    trial's seed; the elementwise worst errors, absolute, relative and over the budget)
    and the output's copy to keep with the verdict (``kept``, :meth:`PreparedTrial.keep`)."""

    prep: PreparedTrial
    index: int
    sample: np.ndarray
    model: ErrorModel
    out_float: str
    seed: int
    worst: tuple[float, float, float]
    kept: np.ndarray | None = None

    def verdict(self) -> TrialResult:
        """The trial's result, with the statistical checks (the frame made before)."""
        prep = self.prep
        assert prep.expected is not None
        bias, spread, why = _statistics(self.sample, prep.expected[0], self.model,
                                        self.out_float, self.seed, prep)
        worst_abs, worst_rel, worst_ratio = self.worst
        return _result(prep, self.index, "fail" if why else "pass", why,
                       failure="values" if why else None, worst_abs=worst_abs,
                       worst_rel=worst_rel, worst_ratio=worst_ratio, bias=bias, spread=spread)


def _run_trials(cand: Candidate, op: Op, prepared: Sequence[PreparedTrial],
                guard: Guard) -> list[TrialResult]:
    """``cand``'s result on each trial, in order. The statistical checks of the outputs
    that reach them run after the candidate's last trial, their frames made for all of
    them at once (:func:`_settle`); and before a trial met again in this gate (a pattern
    re-gated twice) runs again, so that its verdict is known to it."""
    results: list[TrialResult | _Pending] = []
    met: set[int] = set()
    first: list[np.ndarray] = []  # the first output of the trial to repeat (number at)
    at, aim = -1, _to_repeat(prepared)
    for i, prep in enumerate(prepared):
        if id(prep) in met:
            _settle(results)
        met.add(id(prep))
        keep = first if i >= aim and not first else None
        results.append(_check_trial(cand, op, i, prep, guard, keep))
        if first and at < 0:
            at, first[0] = i, np.array(first[0], copy=True)  # the kernel may reuse it
    settled = _settle(results)
    if at >= 0 and settled[at].status == "pass" and not any(
            r.status in ("fail", "error") for r in settled):
        again = _repeated(cand, op, at, prepared[at], first[0], guard, len(settled))
        if again is not None:
            settled.append(again)
    return settled


def _to_repeat(prepared: Sequence[PreparedTrial]) -> int:
    """The trial a candidate runs again (or the first judged after it, when it declines
    that one): the dispatch's own inputs, what it serves; without them, the cheapest."""
    if not prepared or prepared[0].trial.seed is None:
        return 0
    return min(range(len(prepared)), key=lambda i: sum(
        int(getattr(x, "nbytes", 0)) for x in prepared[i].trial.inputs))


def _repeated(cand: Candidate, op: Op, index: int, prep: PreparedTrial, first: np.ndarray,
              guard: Guard, at: int) -> TrialResult | None:
    """``cand`` run REPEATS more times on the trial it passed as the ``index``-th, after
    its other trials (so a kernel's reused buffer holds another input's result): ``None``
    when every call passes again (the same bits are judged once), else the failure,
    numbered ``at``. A wrong output is ``nondeterministic``; inputs written to or an
    exception are what they are on any call, said to be on a repeated one."""
    for call in range(2, 2 + REPEATS):
        got: list[np.ndarray] = []
        judged = _check_trial(cand, op, index, prep, guard, got)
        if isinstance(judged, _Pending):
            judged = _settle([judged])[0]
        if judged.status not in ("fail", "error"):
            continue  # passed, or declined this time: handed on, never wrong
        where = f"call {call} on the same input, after call 1 passed"
        if judged.status == "error" or judged.failure == "inputs_modified":
            return replace(judged, index=at, reason=f"{judged.reason} ({where})",
                           recipe=None)
        return replace(judged, index=at, failure="nondeterministic", recipe=None,
                       input=f"{judged.input or judged.pattern}, run again", reason=(
                           f"returned different results for the same input on calls 1 "
                           f"and {call}: {_difference(first, got)} (call {call}: "
                           f"{judged.reason})"))
    return None


def _difference(first: np.ndarray, got: Sequence[np.ndarray]) -> str:
    """How a repeated call's output differs from the first call's, for people."""
    if not got or got[0].shape != first.shape or got[0].dtype != first.dtype:
        return "outputs of another shape, dtype or structure"
    a, b = first.astype(np.float64), got[0].astype(np.float64)
    differ = ~((a == b) | (np.isnan(a) & np.isnan(b)))
    gaps = np.abs(a - b)[differ & np.isfinite(a) & np.isfinite(b)]
    largest = f"max difference {float(gaps.max()):.3g}" if gaps.size else "non-finite"
    return f"{largest} in {int(differ.sum())} of {differ.size} outputs"


def _settle(results: list[TrialResult | _Pending]) -> list[TrialResult]:
    """``results`` with each pending trial's verdict in its place (kept with the output's
    copy for the trial's next candidates): the frames the trials lack made together, per
    output dtype (:func:`~pytest_arbiter.core.gate_stats.frames`), then each trial's
    checks."""
    pending = [r for r in results if isinstance(r, _Pending)]
    lacking: dict[str, list[_Pending]] = {}
    for p in pending:
        if p.prep.checks is None:
            lacking.setdefault(p.out_float, []).append(p)
    for dtype, group in lacking.items():
        made = frames([FrameRequest(_exact_of(p.prep).reshape(-1), None, p.model, p.seed)
                       for p in group], dtype)
        for p, frame in zip(group, made, strict=True):
            p.prep.checks = frame
    for i, r in enumerate(results):
        if isinstance(r, _Pending):
            results[i] = judged = r.verdict()
            r.prep.remember(r.kept, judged)
    return [r for r in results if isinstance(r, TrialResult)]


def _exact_of(prep: PreparedTrial) -> np.ndarray:
    assert prep.expected is not None
    return prep.expected[0]


def _check_trial(cand: Candidate, op: Op, index: int, prep: PreparedTrial,
                 guard: Guard, outputs: list[np.ndarray] | None = None
                 ) -> TrialResult | _Pending:
    """Run ``cand`` on one gate input and judge its output (NumPy's floating-point
    warnings off: :func:`evaluate` turns them off once for all the trials), but for the
    statistical checks: an output that reaches them is :class:`_Pending`. ``outputs``:
    the output, of the right form, shape and dtype, is appended to it (not copied)."""
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
    want = prep.expected
    assert want is not None
    try:
        prepared = cand.prepare_inputs(*copies)
        with guard():
            form, out, afterwards = _outputs(cand, prepared, want.form)
    except Decline as dec:
        return _result(prep, index, "declined", f"Decline: {dec.reason}")
    except (Exception, CallTimeout) as exc:
        return _result(prep, index, "error", f"raised {type(exc).__name__}: {exc}")
    if not _inputs_kept(prep, afterwards):
        return _result(prep, index, "fail", "the kernel modified its inputs",
                       failure="inputs_modified")
    if out is None:
        return _result(prep, index, "fail", f"returned {form.describe()}; the reference "
                       f"returns {want.form.describe()}", failure="structure")
    if out.shape != want.shape:
        return _result(prep, index, "fail",
                       f"output shape {out.shape}, reference shape {want.shape}",
                       failure="shape")
    if out.ndim == 0:
        out = out.reshape(1)  # judged as one element, as the reference's 0-d result is
    if out.dtype != want.dtype:
        return _result(prep, index, "fail", f"output dtype {out.dtype}, expected "
                       f"{want.dtype}", failure="dtype")
    if outputs is not None:
        outputs.append(out)
    # the verdict on an output is a function of its bits and the trial alone: another
    # candidate's identical output is not judged again
    seen = prep.judged_before(out)
    if seen is not None:
        return seen if seen.index == index else replace(seen, index=index)
    if compares_exactly(op, want.dtype):
        judged: TrialResult | _Pending = _exact_verdict(prep, index, out)
    else:
        judged = _judge_values(op, index, prep, out)
    if isinstance(judged, _Pending):
        judged.kept = prep.keep(out)  # now: the kernel may write into it later
    else:
        prep.remember(prep.keep(out), judged)
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


def _outputs(cand: Candidate, prepared: Sequence[Any], form: OutputForm
             ) -> tuple[OutputForm, np.ndarray | None, list[Any]]:
    """How the candidate's output is packed, the output (several stacked) and its inputs
    after the run, on the host (the copies back wait for a device candidate's work: under
    the watchdog, so a fault or a hang there is this candidate's, never escapes nor blames
    the next). The output is ``None`` when it is not packed as ``form``, the reference's,
    says: it fails as it is, and its parts may not even stack."""
    raw = cand.run(*prepared)
    got = output_form(raw)
    out = None
    if got == form:
        out = np.asarray(to_host(tuple(raw) if got.kind == "list" else raw))
    return got, out, [x if type(x) is np.ndarray else host(x) for x in prepared]


def _inputs_kept(prep: PreparedTrial, afterwards: Sequence[Any]) -> bool:
    """Whether the kernel's inputs are after its run as they were copied: compared with
    the trial's own copies directly, no copy of the kernel's taken before the run."""
    count = len(prep.originals())
    if len(afterwards) != count:
        raise ValueError(f"{len(afterwards)} inputs after the run, {count} before")
    return all(prep.unchanged(i, after) for i, after in enumerate(afterwards))


def _exact_verdict(prep: PreparedTrial, index: int, out: np.ndarray) -> TrialResult:
    """An integer or boolean output: equal to the reference's, element for element (its
    own integers when it gives integers: float64 holds them exactly only up to 2^53)."""
    assert prep.expected is not None
    want = prep.expected.integers
    if want is None:
        wrong = out.astype(np.float64) != prep.expected.exact
    elif np.result_type(out.dtype, want.dtype).kind == "f":  # int64 and uint64: as Python's
        wrong = out.astype(object) != want.astype(object)
    else:
        wrong = out != want
    if not wrong.any():
        return _result(prep, index, "pass")
    where = tuple(int(i) for i in np.argwhere(wrong)[0])
    return _result(prep, index, "fail", (
        f"{int(wrong.sum())} output(s) differ from the reference's exact {out.dtype} "
        f"values, first at {where}: {_exact_pair(out[where], want, prep.expected.exact, where)}"
        " (integer and boolean outputs are compared exactly)"), failure="values")


def _exact_pair(got: Any, integers: np.ndarray | None, exact: np.ndarray,
                where: tuple[int, ...]) -> str:
    """``got X, reference Y`` for one integer or boolean output, each exact, and how far
    apart they are when both are integers."""
    if integers is None:  # a floating-point reference of an integer output
        return f"got {got}, reference {float(exact[where])!r}"
    ref = integers[where]
    if got.dtype.kind == "b" or ref.dtype.kind == "b":
        return f"got {got}, reference {ref}"
    return f"got {int(got)}, reference {int(ref)} (off by {int(got) - int(ref):+d})"


def _judge_values(op: Op, index: int, prep: PreparedTrial,
                  out: np.ndarray) -> TrialResult | _Pending:
    """A floating-point output against the reference: non-finite values, the elementwise
    budget, and on the gate's own random inputs the bias and spread checks (pending: they
    run for the gate's trials together, :func:`_settle`)."""
    trial = prep.trial
    assert prep.expected is not None
    exact = prep.expected[0]
    got = out.astype(np.float64)
    out_float = float_name(out.dtype)
    facts = prep.facts()
    # a user's reference is one implementation among others; a built-in op's exact result
    # is this project's definition, IEEE NaN included
    limits = None if op.builtin else (lambda: _limit_signs(op, prep, exact))
    wrong, numeric, checked = _non_finite(got, exact, out_float, facts.finite, limits,
                                          known=True)
    if wrong:
        return _result(prep, index, "fail", wrong, numeric=numeric, failure="values")
    if facts.nonzero and not got.any():
        return _result(prep, index, "fail", "output is all zeros where the reference is not",
                       failure="values")
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
            f"{float(allowed[where]):.3e} ({worst_ratio:.3g}x the budget)"
            f"{_conditioning_hint(op, prep, err, allowed)}",
            worst_abs=worst_abs, worst_rel=worst_rel, worst_ratio=worst_ratio, failure="values",
            numeric="far_over_budget" if worst_ratio > FAR_OVER_BUDGET else None)
    if (model is not None and trial.seed is not None and out_float in STAT_DTYPES
            and trial.source in _STAT_SOURCES):
        # the checks' null model holds for random inputs only; the dispatch's inputs may
        # be structured (equal rows, sorted values) and make a correct kernel's rounding
        # errors look biased, and offsets and specials add errors of their own
        sample = got if checked is None else np.where(checked, got, np.nan)
        assert out_float is not None
        return _Pending(prep, index, sample, model, out_float, trial.seed,
                        (worst_abs, worst_rel, worst_ratio))
    return _result(prep, index, "pass", worst_abs=worst_abs, worst_rel=worst_rel,
                   worst_ratio=worst_ratio)


def _conditioning_hint(op: Op, prep: PreparedTrial, err: np.ndarray,
                       allowed: np.ndarray) -> str:
    """A user op's trial judged without the reference's sensitivity (the dispatch's own
    inputs, fresh values) that a kernel fails by no more than that sensitivity allows: the
    problem is ill-conditioned there, and a correct kernel may lose this much (a float32
    solve of a system of condition 1e4). Said, not allowed: precision is judged there."""
    if op.builtin or prep.trial.source in SENSITIVE or prep.expected is None:
        return ""
    exact = prep.expected[0]
    originals = tuple(host_copy(x) for x in prep.originals())
    extra = sensitivity(lambda *a: np.atleast_1d(np.asarray(op.reference(*a))),
                        originals, exact, prep.trial.seed or 0)
    if extra.shape != err.shape or not extra.any() or not (err <= allowed + extra).all():
        return ""
    return ("; within what the reference's sensitivity on these inputs lets a correct "
            "kernel lose (an ill-conditioned problem): if that loss is acceptable, give "
            "the op a budget= (docs/accuracy.md, \"User ops\")")


def _limit_signs(op: Op, prep: PreparedTrial, exact: np.ndarray) -> np.ndarray:
    """Where the reference made NaN of infinities on this trial and its limit is
    infinite, the limit's sign (:mod:`pytest_arbiter.core.nan_origin`)."""
    return limit_signs(lambda *inputs: reference_values(op, inputs), prep.originals(),
                       np.isnan(exact))


def _non_finite(got: np.ndarray, exact: np.ndarray, out_float: str | None,
                finite: np.ndarray | None = None,
                limits: Callable[[], np.ndarray] | None = None, *, known: bool = False
                ) -> tuple[str, NumericFailure | None, np.ndarray | None]:
    """Where the reference defines a NaN, the output must be NaN, or the infinity that
    is the limit where the reference made that NaN of infinities (``inf - inf`` in a
    max-shifted log-sum-exp: ``limits()``, the limits' signs, asked only then) rather
    than carried an input's; where it defines an infinity, that infinity or
    NaN (compensated and Strassen-like sums turn ``inf - inf`` into NaN): an
    indeterminate form may be resolved either way, a NaN the data holds may not be
    dropped. Where it is finite, a finite value, unless rounding the exact value to the
    output dtype overflows (then that infinity is right). A non-finite value must never
    come back finite. ``(what is wrong or "", its category, the outputs to hold to the
    budget)``, the mask ``None`` when that is all of them. ``finite``: where ``exact`` is
    finite, ``None`` when it is everywhere (computed here when not given, unless
    ``known``: then ``None`` says it is finite everywhere)."""
    if finite is None and not known and not bool(np.isfinite(exact).all()):
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
    dropped = np.isnan(exact) & ~np.isnan(got)
    resolved = dropped & np.isinf(got)
    if limits is not None and resolved.any():
        dropped &= ~(resolved & (np.sign(got) == limits()))
    checks = (
        (finite & ~np.isfinite(got) & ~overflowed,
         "NaN/Inf output(s) where the reference is finite"),
        (dropped,
         "output(s) not NaN where the reference is NaN (an input's NaN must propagate; "
         "a NaN the reference made of infinities may come back as its infinite limit)"),
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
        results = _run_trials(cand, op, prepared, guard)
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
