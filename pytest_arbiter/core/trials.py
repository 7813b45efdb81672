"""The F4 gate's trials: each gate input and what no candidate changes in it (the
reference's result, the budget, the inputs' copies and checksums), made once and shared
by every candidate gated on the same op, inputs, region and seed."""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

import numpy as np

from pytest_arbiter.core.dtypes import dtype_name, precision
from pytest_arbiter.core.ops import ErrorModel, ErrorScales, Op, error_model, result_dtype, to_host
from pytest_arbiter.core.ops.arrays import ONE_ARRAY, OutputForm, inputs_text, output_form
from pytest_arbiter.core.regions import Region
from pytest_arbiter.core.user_inputs import (
    PATTERN_KINDS,
    Pattern,
    is_scalar,
    pattern_trial,
    sensitivity,
    user_trials,
)

TrialSource = Literal["own", "builtin", "generated", "conditioned", "special", "user"]
"""Where a trial's inputs come from: the dispatch (``own``), a built-in op's generator
(``builtin``), or a user op's extra trials (:data:`~pytest_arbiter.core.user_inputs.TrialKind`)."""
DERIVED = ("generated", "conditioned", "special")
SENSITIVE = ("conditioned", "special", "user")
"""Trials that may be ill-conditioned: their budget adds the reference's sensitivity."""
CHECKSUM_BYTES = 64 * 1024
"""An input larger than this is compared element by element, as unsigned integers of its
element size (by a checksum of its bytes for a size with none), not as a copy of its
bytes."""
JUDGED_OUTPUTS = 4
"""A trial keeps this many distinct outputs and their verdicts, for candidates that return
the same bits (:meth:`PreparedTrial.judged_before`)."""
_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class Trial:
    """One gate input: its seed (``None``: the dispatch's own), the inputs, what it probes
    (for people), where it comes from, and its pattern's short name (``own``,
    ``gate_inputs #i``, ``generated #i``, a derived :data:`PatternKind`, ``regated KIND``),
    recorded for the trials a candidate passed. A derived trial keeps how it was made
    (``recipe``), to be made again for another key; ``regated``: made so, for a
    candidate that failed it on another key of the op."""

    seed: int | None
    inputs: tuple[Any, ...]
    name: str
    source: TrialSource = "own"
    pattern: str = "own"
    recipe: Pattern | None = None
    regated: bool = False


REGATE_SEED = 1000
"""A re-gated pattern's trial is seeded ``seed + REGATE_SEED + its kind's index``."""


def host(x: Any) -> Any:
    """A trial's input on the host; a plain number stays one."""
    return x if is_scalar(x) else to_host(x)


def host_copy(x: Any) -> Any:
    return x if is_scalar(x) else np.array(x, copy=True)


def float_name(dtype: np.dtype) -> str | None:
    """The arbiter's name for a floating output dtype; ``None`` for any other (an int64
    argmax, say), which has no rounding to check."""
    try:
        return dtype_name(dtype)
    except (TypeError, ValueError):
        return None


def checksum(x: np.ndarray) -> int:
    """CRC-32 of ``x``'s element bytes in C order, whatever its memory layout: a change
    within 4 consecutive bytes (one float32 element, or less) is always found, any other
    with probability 1 - 2^-32."""
    return zlib.crc32(np.ascontiguousarray(x).view(np.uint8).data)


def _as_bits(before: Any, after: Any) -> bool:
    """Whether two inputs compare as bits (a NaN's payload and a zero's sign count): arrays
    of one plain dtype and shape; anything else compares as values."""
    return (isinstance(before, np.ndarray) and isinstance(after, np.ndarray)
            and before.dtype == after.dtype and before.shape == after.shape
            and not before.dtype.hasobject and before.dtype.fields is None)


class ExactFacts(NamedTuple):
    """What judging an output reads of the reference's exact result besides its values:
    where it is finite (``None``: everywhere), whether it has a non-zero element, and
    the relative error's divisor, ``|exact|`` but at least the smallest normal float64
    (that also where ``exact`` is NaN)."""

    finite: np.ndarray | None
    nonzero: bool
    scale: np.ndarray


def _bits(x: np.ndarray) -> np.ndarray | None:
    """``x``'s elements as unsigned integers of their size (a view), or ``None`` for a
    dtype whose elements are not plain numbers of 2, 4 or 8 bytes."""
    unsigned = _BITS.get(x.dtype.itemsize)
    if unsigned is None or x.dtype.hasobject or x.dtype.fields is not None:
        return None
    return x.view(unsigned)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays have one dtype and shape and the same bits in every element
    (a NaN's payload and a zero's sign count)."""
    if a.dtype != b.dtype or a.shape != b.shape or a.dtype.hasobject:
        return False
    if a.nbytes <= CHECKSUM_BYTES:  # both in C order, whatever their layouts
        return a.tobytes() == b.tobytes()
    bits_a, bits_b = _bits(a), _bits(b)
    return bits_a is not None and bits_b is not None and bool(np.array_equal(bits_a, bits_b))


class Expected(NamedTuple):
    """What a candidate's output must be on a trial: the float64 ground truth
    (``exact``), the ``dtype`` and ``shape`` the output must have, the floating dtype the
    reference computed in (``computed_in``, ``None``: not floating point), how the
    output is packed (``form``: one array, a tuple of ``n``) and, for a reference whose
    result is integer or boolean, its own values (``integers``: float64 holds integers
    exactly only up to 2^53; ``None`` otherwise)."""

    exact: np.ndarray
    dtype: np.dtype
    computed_in: str | None
    shape: tuple[int, ...]
    form: OutputForm = ONE_ARRAY
    integers: np.ndarray | None = None


@dataclass(eq=False)
class PreparedTrial:
    """One trial and what no candidate changes in it, each part made at the first
    candidate that needs it and kept for the others: the inputs' host copies (what the
    reference and the budget read, and what a kernel's inputs must still be after its
    run), the reference's result, why the trial is skipped (``""``: it is not), the
    budget, large inputs' checksums, the statistical checks' weights and the verdicts on
    the first distinct outputs (the verdict on an output is a function of its bits and the
    trial alone)."""

    trial: Trial
    shapes: str
    copies: tuple[Any, ...] | None = None
    expected: Expected | None = None
    skip: str | None = None
    budget: tuple[ErrorModel | None, np.ndarray] | None = None
    sums: dict[int, int] = field(default_factory=dict)
    checks: Any = None
    """The statistical checks' part that reads no output (:mod:`pytest_arbiter.core.gate`'s)."""
    exact_facts: ExactFacts | None = None
    judged: list[tuple[np.ndarray, bytes | None, Any]] = field(default_factory=list)
    """Outputs judged on this trial (copies, and their bytes in C order up to
    CHECKSUM_BYTES) and their verdicts, at most JUDGED_OUTPUTS."""
    raw: dict[int, bytes] = field(default_factory=dict)
    """The inputs' copies' bytes in C order, for those compared so (made once)."""

    def facts(self) -> ExactFacts:
        """:class:`ExactFacts` of the reference's result, made once."""
        if self.exact_facts is None:
            assert self.expected is not None
            exact = self.expected[0]
            finite = np.isfinite(exact)
            scale = np.fmax(np.abs(exact), np.finfo(np.float64).tiny)
            self.exact_facts = ExactFacts(None if bool(finite.all()) else finite,
                                          bool(exact.size) and bool(exact.any()), scale)
        return self.exact_facts

    def judged_before(self, out: np.ndarray) -> Any:
        """The verdict already given on an output with ``out``'s bits, dtype and shape
        (``None``: none was)."""
        now: bytes | None = None
        for seen, raw, verdict in self.judged:
            if raw is None:
                if same_bits(seen, out):
                    return verdict
            elif seen.dtype == out.dtype and seen.shape == out.shape:
                if now is None:
                    now = out.tobytes()  # in C order, whatever its layout
                if raw == now:
                    return verdict
        return None

    def keep(self, out: np.ndarray) -> np.ndarray | None:
        """A copy of ``out`` to keep with its verdict (:meth:`remember`), taken when the
        output is judged (a kernel may write into the array it returned later); ``None``
        when the trial keeps JUDGED_OUTPUTS already, or ``out`` has no plain bits."""
        if len(self.judged) < JUDGED_OUTPUTS and _bits(out) is not None:
            return np.array(out, copy=True)
        return None

    def remember(self, kept: np.ndarray | None, verdict: Any) -> None:
        """Keep ``verdict`` for outputs with the bits of ``kept`` (:meth:`keep`'s copy;
        ``None``: nothing is kept)."""
        if kept is not None and len(self.judged) < JUDGED_OUTPUTS:
            raw = kept.tobytes() if kept.nbytes <= CHECKSUM_BYTES else None
            self.judged.append((kept, raw, verdict))

    def originals(self) -> tuple[Any, ...]:
        if self.copies is None:
            self.copies = tuple(host_copy(x) for x in self.trial.inputs)
        return self.copies

    def unchanged(self, i: int, now: Any) -> bool:
        """Whether ``now`` is still input ``i`` as it was copied, bit for bit: the
        elements' bytes in C order, past CHECKSUM_BYTES the elements as unsigned integers
        (one pass over both, no checksum of the copy to make first), or their
        :func:`checksum` for an element size with no such integer; an input whose dtype or
        shape differs, or that has no bits to compare, as values (NaN equal to NaN)."""
        before = self.originals()[i]
        if not _as_bits(before, now):
            return bool(np.array_equal(before, now, equal_nan=True))
        if before.nbytes <= CHECKSUM_BYTES:  # both in C order, whatever their layouts
            raw = self.raw.get(i)
            if raw is None:
                raw = self.raw[i] = before.tobytes()  # the copy is never written to
            return raw == now.tobytes()
        bits_before, bits_now = _bits(before), _bits(now)
        if bits_before is not None and bits_now is not None:
            return bool(np.array_equal(bits_before, bits_now))
        if i not in self.sums:
            self.sums[i] = checksum(before)
        return self.sums[i] == checksum(now)

    def skip_reason(self, op: Op) -> str:
        """Why the trial checks nothing (``""``: it checks), the reference run at the first
        call: a derived trial on which it raises is skipped; on another trial its error is
        the caller's, raised at each call."""
        if self.skip is None:
            try:
                self.expected = _expected(op, self.originals())
            except Exception as exc:
                if self.trial.source not in DERIVED:
                    raise
                self.skip = f"skipped: the reference raised {type(exc).__name__}"
                return self.skip
            self.skip = _unrepresentable(self.trial.source, self.expected.exact,
                                         self.expected.dtype)
        return self.skip

    def budget_for(self, op: Op, out_float: str | None) -> tuple[ErrorModel | None, np.ndarray]:
        """:func:`_budget`, made once: every candidate judged on values has the output
        dtype the reference gives (``out_float``), or failed before."""
        if self.budget is None:
            self.budget = _budget(op, self, out_float)
        return self.budget


def _layout_of(inputs: Sequence[Any]) -> tuple[tuple[Any, Any, Any], ...]:
    return tuple((getattr(x, "shape", None), getattr(x, "strides", None),
                  getattr(x, "dtype", None)) for x in inputs)


@dataclass(eq=False)
class GateTrials:
    """The gate's inputs for one op, region and seed (and the dispatch's own inputs when
    gated on them), prepared once for every candidate gated on them (:func:`gate_trials`)."""

    op: Op
    region: Region
    seed: int
    given: tuple[Any, ...] | None
    """The dispatch's inputs as given (the very objects), when gated on them."""
    layout: tuple[tuple[Any, Any, Any], ...]
    trials: tuple[PreparedTrial, ...]
    made: dict[Pattern, PreparedTrial | None] = field(default_factory=dict)
    """:meth:`regated`'s trials, made once for the candidates that need them."""
    kept_as: tuple[int, Region, int] | None = None
    """The key these trials are kept under for gates on their region, if they are."""

    def settle(self) -> None:
        """After a gate: stop keeping these trials for their region if what they now hold
        (:func:`held_bytes`) is over REGION_TRIALS_BYTES."""
        if self.kept_as is not None and held_bytes(self) > REGION_TRIALS_BYTES:
            self.forget()

    def forget(self) -> None:
        """Stop keeping these trials for their region."""
        if self.kept_as is not None:
            with _REGION_LOCK:
                if _REGION_TRIALS.get(self.kept_as) is self:
                    del _REGION_TRIALS[self.kept_as]
            self.kept_as = None

    def intact(self) -> bool:
        """Whether every trial's inputs are still, bit for bit, what the reference and the
        budget were made from (no candidate's code sees them, the gate hands it copies:
        a check that what a region's next gate reuses was not written to)."""
        return all(prep.copies is None or all(prep.unchanged(i, x) for i, x in
                                               enumerate(prep.trial.inputs))
                   for prep in self.trials)

    def regated(self, patterns: Sequence[Pattern]) -> list[PreparedTrial]:
        """Each of ``patterns`` (derived trials that failed a candidate on another key of
        the op) made for these inputs' shapes (:func:`pattern_trial`), when the op's
        ``validate`` takes it; none without the dispatch's inputs."""
        out = []
        for pattern in patterns:
            if pattern not in self.made:
                self.made[pattern] = self._regate(pattern)
            made = self.made[pattern]
            if made is not None:
                out.append(made)
        return out

    def _regate(self, pattern: Pattern) -> PreparedTrial | None:
        if self.given is None:
            return None
        seed = self.seed + REGATE_SEED + PATTERN_KINDS.index(pattern.kind)
        made = pattern_trial(pattern, self.trials[0].trial.inputs, seed)
        if made is None:
            return None
        try:
            self.op.validate(*made.inputs)
        except Exception:  # values the op does not take: not a trial
            return None
        trial = Trial(seed, made.inputs, f"{made.name}, as on another key", made.kind,
                      f"regated {pattern.kind}", made.recipe, regated=True)
        return PreparedTrial(trial, _shape_text(made.inputs))

    def holds_for(self, op: Op, inputs: Sequence[Any] | None, region: Region | None,
                  seed: int) -> bool:
        """Whether these are the trials of ``op`` on ``inputs`` and ``region`` with
        ``seed``: the same op object and seed, an equal region (or none given), and the
        very input objects, with the shapes, strides and dtypes they had and, bit for bit,
        the values (:meth:`PreparedTrial.unchanged`): a user op's trials are made from
        the inputs' values, and equal values make the same trials."""
        if op is not self.op or seed != self.seed or (region is not None
                                                        and region != self.region):
            return False
        if inputs is None or self.given is None:
            return inputs is None and self.given is None
        if len(inputs) != len(self.given) or _layout_of(inputs) != self.layout \
                or any(a is not b for a, b in zip(inputs, self.given, strict=True)):
            return False
        own = self.trials[0]
        return all(own.unchanged(i, host(x)) for i, x in enumerate(inputs))


REGION_TRIALS_KEPT = 4
"""How many regions' trials a process keeps for gates on a region alone (no inputs)."""
REGION_TRIALS_BYTES = 8 << 20
"""A region's trials are kept only while the arrays they hold (inputs and copies, the
reference's results, budgets, outputs judged) stay within this many bytes."""
_REGION_TRIALS: OrderedDict[tuple[int, Region, int], GateTrials] = OrderedDict()
_REGION_LOCK = threading.Lock()


def forget_region_trials() -> None:
    """Drop every region's trials kept for gates on a region alone."""
    with _REGION_LOCK:
        _REGION_TRIALS.clear()


def gate_trials(op: Op, *, inputs: Sequence[Any] | None, region: Region | None,
                seed: int) -> GateTrials:
    """The gate's trials of ``op`` on ``inputs`` (if given) and ``region``, to share among
    the candidates gated on them. Raises what the gate raises for them: inputs the op
    refuses, neither inputs nor region, a user op's ``gate_inputs`` the op refuses.

    A built-in op's trials on a region alone are a function of the op object (a changed
    policy, TF32 say, makes a new one), the region and the seed: the last
    REGION_TRIALS_KEPT regions' are kept for the next gate on them (a test gating several
    candidates on a region, a gate matrix), what was made of them included, unless they
    hold more than REGION_TRIALS_BYTES (:meth:`GateTrials.settle`)."""
    if inputs is None and region is not None and op.builtin:
        key = (id(op), region, seed)
        with _REGION_LOCK:
            kept = _REGION_TRIALS.get(key)
            if kept is not None and kept.op is op:
                _REGION_TRIALS.move_to_end(key)
        if kept is not None and kept.op is op:
            if kept.intact():
                return kept
            kept.forget()  # written to: made again
        made = _prepared(op, None, region, seed)
        if sum(_nbytes(t.trial.inputs) for t in made.trials) <= REGION_TRIALS_BYTES // 2:
            made.kept_as = key
            with _REGION_LOCK:
                _REGION_TRIALS[key] = made
                while len(_REGION_TRIALS) > REGION_TRIALS_KEPT:
                    _REGION_TRIALS.popitem(last=False)
        return made
    return _prepared(op, inputs, region, seed)


def _nbytes(inputs: Sequence[Any]) -> int:
    return sum(int(getattr(x, "nbytes", 0)) for x in inputs)


def held_bytes(trials: GateTrials) -> int:
    """The bytes of the arrays ``trials`` hold: the inputs and their copies (and the
    copies' bytes), the reference's results (twice: an error model keeps arrays of their
    size too), the budgets, the judged outputs (and their bytes)."""
    total = 0
    for prep in trials.trials:
        total += _nbytes(prep.trial.inputs) + _nbytes(prep.copies or ())
        if prep.expected is not None:
            total += 2 * prep.expected.exact.nbytes
            if prep.expected.integers is not None:
                total += prep.expected.integers.nbytes
        if prep.budget is not None:
            total += prep.budget[1].nbytes
        if prep.exact_facts is not None:
            total += prep.exact_facts.scale.nbytes
        total += sum(out.nbytes + len(raw or b"") for out, raw, _ in prep.judged)
        total += sum(len(raw) for raw in prep.raw.values())
    return total


def _prepared(op: Op, inputs: Sequence[Any] | None, region: Region | None,
              seed: int) -> GateTrials:
    region, trials = _trials(op, inputs, region, seed)
    prepared = tuple(PreparedTrial(t, _shape_text(t.inputs)) for t in trials)
    given = None if inputs is None else tuple(inputs)
    if given is not None:
        prepared[0].originals()  # the copy holds_for compares the inputs with
    return GateTrials(op, region, seed, given, _layout_of(given or ()), prepared)


def _trials(op: Op, inputs: Sequence[Any] | None, region: Region | None,
            seed: int) -> tuple[Region, list[Trial]]:
    """The region and the gate's inputs: the dispatch's own, then a built-in op's
    generated ones, or a user op's extra trials (its ``gate_inputs``', then the derived)."""
    trials: list[Trial] = []
    if inputs is not None:
        op.validate(*inputs)
        own = tuple(host(x) for x in inputs)
        trials.append(Trial(None, own, "the dispatch's own inputs"))
        if region is None:
            region = op.region_of(*inputs)
        if op.gate_inputs is None and not op.builtin:
            extra = user_trials(op.validate, op.user_gate_inputs, op.name, own, seed)
            trials.extend(Trial(seed + i, t.inputs, t.name, t.kind,
                                t.recipe.kind if t.recipe else t.name, t.recipe)
                          for i, t in enumerate(extra))
    if region is None:
        raise ValueError("f4_gate needs inputs or a region")
    if op.gate_inputs is not None:
        generated = op.gate_inputs(region, seed)
        names = getattr(generated, "names", None) or []
        trials.extend(Trial(seed + i, t, names[i] if i < len(names)
                            else f"generated input {i}", "builtin", f"generated #{i}")
                      for i, t in enumerate(generated))
    if not trials and op.builtin:
        raise ValueError(f"{region.describe()} has an empty output: a gate on the region "
                         "alone has nothing to check; gate a region with no zero dimension")
    return region, trials


def _shape_text(inputs: Sequence[Any]) -> str:
    """The inputs for a message: shapes, a layout other than C order, numbers' values."""
    return inputs_text(inputs)


def reference_values(op: Op, inputs: Sequence[Any]) -> np.ndarray:
    """The op's float64 ground truth of ``inputs`` (:func:`_expected`'s first part)."""
    return _expected(op, inputs)[0]


def _expected(op: Op, inputs: Sequence[np.ndarray]) -> Expected:
    """What a candidate's output must be on ``inputs`` (:class:`Expected`). A 0-d result
    (a dot product, a norm) is judged as one element: NumPy's arithmetic on 0-d arrays
    gives scalars, which the budget's in-place steps cannot write to."""
    if op.builtin:
        exact = op.exact(*inputs)
        return Expected(exact, result_dtype(op, inputs, None), "float64", exact.shape)
    out = op.reference(*[host_copy(x) for x in inputs])
    ref = _as_one_array(op, out)
    integers = np.atleast_1d(ref) if ref.dtype.kind in "biu" else None
    return Expected(np.atleast_1d(ref.astype(np.float64)), result_dtype(op, inputs, ref),
                    float_name(ref.dtype), ref.shape, output_form(out), integers)


def _as_one_array(op: Op, out: Any) -> np.ndarray:
    """A reference's output as one array; several outputs (a tuple) stacked, which the
    gate can judge only when they have one shape."""
    if isinstance(out, tuple):
        shapes = [tuple(np.shape(part)) for part in out]
        if len(set(shapes)) > 1:
            raise ValueError(
                f"op {op.name!r}: its reference returns {len(out)} outputs of shapes "
                f"{', '.join(map(str, shapes))}: the F4 gate judges several outputs only "
                "when they have one shape; register an op per output")
        dtypes = [np.asarray(to_host(part)).dtype for part in out]
        if len({d.kind in "biu" for d in dtypes}) > 1:  # exact and rounded: not one check
            raise ValueError(
                f"op {op.name!r}: its reference returns {len(out)} outputs of dtypes "
                f"{', '.join(map(str, dtypes))}: the F4 gate judges several outputs only "
                "when all are integer (or boolean) or all floating-point; register an op "
                "per output")
    return np.asarray(to_host(out))


def _unrepresentable(source: TrialSource, exact: np.ndarray, out_dtype: np.dtype) -> str:
    """Why a derived trial checks nothing (``""``: it does): its exact result overflows
    the output dtype, or is not finite although its inputs are (the reference's own
    overflow). Special values' NaN and inf are what a kernel must match."""
    if source not in DERIVED:
        return ""
    finite = np.isfinite(exact)
    if source != "special" and not bool(finite.all()):
        return "skipped: the reference is not finite on these finite inputs"
    name = float_name(out_dtype)
    if name is not None and exact.size and float(np.max(
            np.abs(np.where(finite, exact, 0.0)))) > precision(name).largest:
        return f"skipped: the exact result overflows {name}"
    return ""


def _budget(op: Op, prep: PreparedTrial, out_float: str | None
            ) -> tuple[ErrorModel | None, np.ndarray]:
    """The error model (``None``: a user op's own ``budget=``) and the elementwise budget
    of one trial. A trial whose inputs the gate or the op's ``gate_inputs`` chose beyond
    fresh draws (large magnitudes, offsets, special values, the user's own) may be
    ill-conditioned: its budget adds the reference's measured sensitivity, and so does the
    statistical checks' scale of a correct kernel's error (docs/accuracy.md). A user op's
    budget and reference read copies: the trial's own stay as the kernels must leave theirs."""
    trial = prep.trial
    assert prep.expected is not None
    exact, reference_dtype = prep.expected.exact, prep.expected.computed_in
    originals = [x if op.builtin else host_copy(x) for x in prep.originals()]
    model = error_model(op, originals, exact, generated=trial.seed is not None,
                        out_dtype=out_float, reference_dtype=reference_dtype)
    if trial.source not in SENSITIVE:
        allowed = model.allowed if model is not None else np.asarray(
            op.budget(originals, exact), dtype=np.float64)
        return model, allowed
    extra = sensitivity(lambda *a: np.atleast_1d(np.asarray(op.reference(*a))),
                        tuple(originals), exact, trial.seed or 0)
    if model is not None:
        model = _widened(model, extra)
        return model, model.allowed
    return None, np.asarray(op.budget(originals, exact), dtype=np.float64) + extra


def _widened(model: ErrorModel, extra: np.ndarray) -> ErrorModel:
    """``model`` with ``extra`` (absolute, per output) added to its budget and to the scale
    of the independent random part of a correct kernel's error."""
    flat = extra.reshape(-1)
    base = model.scales

    def scales(index: np.ndarray) -> ErrorScales:
        terms = base(index)
        return terms._replace(sd=terms.sd + flat[index])

    return replace(model, allowed=model.allowed + extra, scales=scales)
