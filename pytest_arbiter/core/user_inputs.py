"""A user op's gate inputs beyond the dispatch's own: the op's ``gate_inputs(inputs, rng)``
when it gives one, else trials derived from the dispatch's inputs (same shapes and dtypes,
other values), and the allowance the derived ill-conditioned ones get (docs/accuracy.md,
"User ops: what the gate derives")."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from pytest_arbiter.core.dtypes import precision

TrialKind = Literal["generated", "conditioned", "special", "user"]
"""What a trial's values are: fresh i.i.d. draws (``generated``: the statistical checks
hold), large magnitudes or offsets (``conditioned``: the budget adds the reference's own
sensitivity), special values (``special``), or the op's own ``gate_inputs`` (``user``)."""

UserGateInputs = Callable[[tuple[Any, ...], np.random.Generator], Sequence[Any]]

PatternKind = Literal["fresh", "large_magnitude", "large_offset", "special"]
"""The derived trials, in order (docs/accuracy.md, "User ops: the gate's inputs")."""
PATTERN_KINDS: tuple[PatternKind, ...] = ("fresh", "large_magnitude", "large_offset", "special")

_MIN_DISTINCT = 8
"""An input with fewer distinct values than this (a mask, a constant weight) is kept."""
_OFFSET_STEP = 64.0
_SENSITIVITY_LAMBDA = 8.0
_NUDGE = 2.0 ** -26
"""The relative move of the sensitivity probe: far above float64's rounding, far below
any input dtype's."""


@dataclass(frozen=True)
class Pattern:
    """How a derived trial was made, to make it again for other inputs of the op (another
    key's shapes and dtypes, :func:`pattern_trial`): its kind, the input it changed, the
    RMS of that input's fresh values and, for large magnitudes, the largest ``|x|``."""

    kind: PatternKind
    input: int
    scale: float
    top: float = 0.0


@dataclass(frozen=True)
class UserTrial:
    """One extra gate input of a user op: what it probes, the input tuple, its kind and,
    for a derived trial, how it was made."""

    name: str
    inputs: tuple[Any, ...]
    kind: TrialKind
    recipe: Pattern | None = None


def is_scalar(x: Any) -> bool:
    """A plain Python number (or bool): passed through the gate as it is."""
    return isinstance(x, (bool, int, float))


def is_float_array(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return (isinstance(x, np.ndarray) and dtype is not None
            and (dtype.kind == "f" or dtype.name == "bfloat16"))


def user_trials(validate: Callable[..., None], gate_inputs: UserGateInputs | None,
                op_name: str, inputs: tuple[Any, ...], seed: int) -> list[UserTrial]:
    """The extra trials of one dispatch: ``gate_inputs(inputs, rng)``'s, each checked by
    ``validate`` (a refused one is ``ValueError``: the generator is wrong), then the
    derived ones that ``validate`` accepts. The op's own inputs add to the derived ones:
    they probe what the op's author knows of, the derived ones what a test's inputs hide
    (ties, NaN, overflow), and neither replaces the other."""
    given = [] if gate_inputs is None else _given_trials(validate, gate_inputs, op_name,
                                                         inputs, seed)
    kept = []
    for trial in derived_trials(inputs, seed):
        try:
            validate(*trial.inputs)
        except Exception:  # derived values the op does not take: not a trial
            continue
        kept.append(trial)
    return given + kept


def _given_trials(validate: Callable[..., None], gate_inputs: UserGateInputs, op_name: str,
                  inputs: tuple[Any, ...], seed: int) -> list[UserTrial]:
    made = gate_inputs(inputs, np.random.default_rng(seed))
    if isinstance(made, tuple) or not isinstance(made, Sequence):
        raise TypeError(f"op {op_name!r}: gate_inputs must return a list of input tuples, "
                        f"got {type(made).__name__}")
    trials = []
    for i, item in enumerate(made):
        args = tuple(item) if isinstance(item, (tuple, list)) else (item,)
        try:
            validate(*args)
        except Exception as exc:
            raise ValueError(f"op {op_name!r}: gate_inputs returned input tuple #{i} that the "
                             f"op's validate refuses: {exc}") from exc
        trials.append(UserTrial(f"gate_inputs #{i}", args, "user"))
    return trials


def same_layout_copy(x: Any) -> Any:
    """A copy of ``x`` with the same shape, dtype and strides (a strided or reversed view
    stays one, over memory of its own); a plain number as it is; anything else:
    ``np.array(x, copy=True)``."""
    if is_scalar(x):
        return x  # a plain number: immutable, passed as it is
    if not isinstance(x, np.ndarray) or x.size == 0 or x.flags.c_contiguous \
            or x.flags.f_contiguous:
        return np.array(x, copy=True, order="K")
    low = sum(st * (n - 1) for st, n in zip(x.strides, x.shape, strict=True) if st < 0)
    high = sum(st * (n - 1) for st, n in zip(x.strides, x.shape, strict=True) if st > 0)
    # whole items, so the buffer's alignment (NumPy's, at least 16 bytes) is the items'
    items = -(-(high - low + x.itemsize) // x.itemsize)
    try:
        base = np.empty(items, dtype=x.dtype)
        twin: np.ndarray = np.ndarray(x.shape, x.dtype, buffer=base, offset=-low,
                                      strides=x.strides)
    except (TypeError, ValueError):  # strides NumPy will not rebuild: a packed record view
        return np.array(x, copy=True, order="K")
    twin[...] = x
    return twin


def _varied(inputs: tuple[Any, ...]) -> list[int]:
    """The inputs whose values the derived trials change: floating-point arrays with at
    at least 8 distinct finite values among their first 32 (integer, boolean and scalar
    inputs, masks, constant weights and tiny arrays keep the dispatch's values)."""
    out = []
    for i, x in enumerate(inputs):
        if is_float_array(x) and x.size:
            head = np.asarray(x.reshape(-1)[:4 * _MIN_DISTINCT], dtype=np.float64)
            if np.unique(head[np.isfinite(head)]).size >= _MIN_DISTINCT:
                out.append(i)
    return out


def _finite(x: np.ndarray) -> np.ndarray:
    values = np.asarray(x, dtype=np.float64)
    return values[np.isfinite(values)]


def _rms(x: np.ndarray) -> float:
    """``x``'s RMS over its finite values (1 when there is none, or it is 0)."""
    finite = _finite(x)
    scale = float(np.sqrt(np.mean(finite * finite))) if finite.size else 1.0
    return scale if scale > 0 else 1.0


def _redraw(x: np.ndarray, rng: np.random.Generator, scale: float) -> np.ndarray:
    """I.i.d. values of RMS ``scale`` in ``x``'s shape and sign class (non-negative stays
    so)."""
    draw = rng.standard_normal(x.shape) * scale
    finite = _finite(x)
    if finite.size and float(finite.min()) >= 0.0:
        draw = np.abs(draw)
    return draw


def _cast(values: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``values`` in ``like``'s dtype and memory layout (a kernel's verdict holds for the
    layout it was checked on: a derived trial keeps the dispatch's)."""
    out = same_layout_copy(like)
    with np.errstate(over="ignore", invalid="ignore"):
        out[...] = values
    return out


def _large_magnitude(dtype: np.dtype, size: int) -> float:
    """How large the scaled input gets: toward the dtype's range, yet far enough below it
    that a correct kernel's squares and sums (in float32 for 16-bit inputs) stay finite."""
    p = precision(dtype)
    acc = precision(np.float64 if p.name == "float64" else np.float32).largest
    top = min(p.largest / 16.0, acc ** 0.25, math.sqrt(acc / (16.0 * max(size, 1))))
    return float(2.0 ** math.floor(math.log2(top)))


def _rows(x: np.ndarray) -> np.ndarray:
    """``x`` as (rows, last axis): a view when it can be."""
    return x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)


def _tie_value(v: float) -> float:
    """The value a tied run repeats: ``v`` rounded to a power of two (same sign), so that
    its multiples, its square's and its partial sums are exact in any accumulator. A value
    with a full fraction, added to itself, rounds the same way at every step: its sum errs
    like ``n u |S|``, no random walk, and fails a correct kernel (docs/accuracy.md)."""
    if v == 0.0 or not math.isfinite(v):
        return 0.0
    return math.copysign(2.0 ** round(math.log2(abs(v))), v)


def _specials(x: np.ndarray) -> tuple[np.ndarray, str]:
    """Special rows in a fresh draw: a constant row of a power of two (ties), signed zeros,
    and with five rows or more a NaN, a +inf and a -inf (+inf again for a non-negative
    input)."""
    out = np.array(x, dtype=np.float64, copy=True)
    rows = _rows(out)
    n = rows.shape[1]
    tie = _tie_value(float(rows[0, 0]))
    if rows.shape[0] < 5:
        rows[0, :n // 2] = tie
        rows[0, n // 2:] = np.where(np.arange(n - n // 2) % 2, -0.0, 0.0)
        return out, "ties and signed zeros in the last axis' halves"
    negative = bool((x < 0).any())
    rows[0] = tie
    rows[1] = np.where(np.arange(n) % 2, -0.0, 0.0) if negative else 0.0
    rows[2, n // 2] = np.nan
    rows[3, n // 3] = np.inf
    rows[4, (2 * n) // 3] = -np.inf if negative else np.inf
    return out, "special rows: a constant row (ties), signed zeros, a NaN, +inf, -inf"


def _offset_rows(base: np.ndarray, peak: float, *, narrow: bool
                 ) -> tuple[np.ndarray, float, float]:
    """``base`` with each row centred on its mean, plus an offset and ``64 (row % 16)``,
    both times the power of two at or above ``peak / 12``: ``(values, offset, step)``.

    The offset keeps a long sum's or scan's rounding errors independent and zero-mean, as
    a correct kernel's budget assumes; an offset off the partial sums' grid, or a
    remainder of one sign, rounds every addition alike once the partial sums outgrow it
    (docs/accuracy.md). Float32 and float64 rows keep their fraction bits: the offset is
    1024, a power of two, and the remainder is centred. A 16-bit row rounds to a grid on
    which a float32 sum of it is exact: its offset is 3000, between two bfloat16
    numbers, so that a row keeps two values or more."""
    lift = 2.0 ** max(0, math.ceil(math.log2(peak / 12.0)))
    offset = (3000.0 if narrow else 1024.0) * lift
    step = _OFFSET_STEP * lift
    rows = _rows(base)
    centred = rows - rows.mean(axis=1, keepdims=True)
    index = (np.arange(rows.shape[0]) % 16).reshape(-1, 1)
    return (centred + offset + step * index).reshape(base.shape), offset, step


def derived_trials(inputs: tuple[Any, ...], seed: int) -> list[UserTrial]:
    """Four trials of the dispatch's shapes and dtypes: fresh values, large magnitudes,
    large offsets per row, special values. Only the varied inputs change (:func:`_varied`);
    the largest of them (the first, on a tie) gets the magnitudes, offsets and specials."""
    varied = _varied(inputs)
    if not varied:
        return []
    main = max(varied, key=lambda i: (inputs[i].size, -i))
    rng = np.random.default_rng(seed)
    fresh = {i: _redraw(inputs[i], rng, _rms(inputs[i])) for i in varied}
    return [_made(kind, inputs, fresh, main, _large_magnitude(inputs[main].dtype,
                                                               inputs[main].size))
            for kind in PATTERN_KINDS]


def pattern_trial(pattern: Pattern, inputs: tuple[Any, ...], seed: int) -> UserTrial | None:
    """``pattern`` (a derived trial that failed a candidate on other inputs of the op: another
    key's) made again for ``inputs``' shapes and dtypes, at its own scale and magnitude
    where a correct kernel stays finite here (both capped by this size's large magnitude);
    the input it changed is changed here too, even where the derived trials would keep
    its values (a test's coarse grid). ``None``: no floating-point input to change."""
    main = pattern.input
    if not (main < len(inputs) and is_float_array(inputs[main]) and inputs[main].size):
        floats = [i for i, x in enumerate(inputs) if is_float_array(x) and x.size]
        if not floats:
            return None
        main = max(floats, key=lambda i: (inputs[i].size, -i))
    x = inputs[main]
    top = _large_magnitude(x.dtype, x.size)
    if pattern.top:
        top = min(top, pattern.top)
    rng = np.random.default_rng(seed)
    fresh = {i: _redraw(inputs[i], rng, _rms(inputs[i])) for i in _varied(inputs) if i != main}
    fresh[main] = _redraw(x, rng, min(pattern.scale, top / 8.0))
    return _made(pattern.kind, inputs, fresh, main, top)


def _made(kind: PatternKind, inputs: tuple[Any, ...], fresh: dict[int, np.ndarray],
          main: int, top: float) -> UserTrial:
    """One derived trial: the inputs in ``fresh`` take those values, ``main`` the kind's
    (made from its fresh values: ``top`` is the large magnitudes' largest ``|x|``)."""
    x, base = inputs[main], fresh[main]
    peak = float(np.max(np.abs(base), initial=0.0)) or 1.0
    pattern = Pattern(kind, main, float(np.sqrt(np.mean(base * base))) if base.size else 1.0)
    source: TrialKind = "conditioned"
    if kind == "fresh":
        name, source, values = "fresh values of the dispatch's shapes", "generated", base
    elif kind == "large_magnitude":
        name = f"large magnitudes: input {main} scaled to max |x| near {top:.3g}"
        values = base * 2.0 ** math.floor(math.log2(top / peak))
        pattern = replace(pattern, top=top)
    elif kind == "large_offset":
        values, offset, step = _offset_rows(base, peak, narrow=x.dtype.itemsize == 2)
        name = f"large offsets: input {main} centred + {offset:.6g} + {step:.6g} x (row % 16)"
    else:
        values, what = _specials(base)
        name, source = f"{what} (input {main})", "special"
    merged = {**fresh, main: values}
    args = tuple(_cast(merged[i], inputs[i]) if i in merged else inputs[i]
                 for i in range(len(inputs)))
    return UserTrial(name, args, source, pattern)


def sensitivity(reference: Callable[..., Any], inputs: tuple[Any, ...], exact: np.ndarray,
                seed: int) -> np.ndarray:
    """What a correct kernel may lose on an ill-conditioned trial, beyond the default
    budget: the reference's change when every floating-point input moves by a relative
    ``2^-26`` (random signs; the moved inputs are float64, so the move is not rounded
    away), taken per element or as its RMS over the output, whichever is larger, and scaled
    to a backward error of ``8 sqrt(longest axis)`` units of the accumulator's rounding
    (a sum's). Zero where it cannot be measured (the reference raised)."""
    floats = [i for i, x in enumerate(inputs) if is_float_array(x) and x.size]
    if not floats or not exact.size:
        return np.zeros(exact.shape)
    rng = np.random.default_rng(seed ^ 0x5EED)
    moved = list(inputs)
    for i in floats:
        x = np.asarray(inputs[i], dtype=np.float64)
        moved[i] = x * (1.0 + _NUDGE * (rng.integers(0, 2, x.shape) * 2.0 - 1.0))
    try:
        with np.errstate(all="ignore"):
            out = np.asarray(reference(*moved), dtype=np.float64)
    except Exception:
        return np.zeros(exact.shape)
    if out.shape != exact.shape:
        return np.zeros(exact.shape)
    delta = np.abs(out - exact)
    delta = np.where(np.isfinite(delta), delta, 0.0)
    spread = float(np.sqrt(np.mean(delta * delta)))
    p = precision(inputs[floats[0]].dtype)
    longest = max(max(inputs[i].shape, default=1) for i in floats)
    factor = _SENSITIVITY_LAMBDA * math.sqrt(longest) * p.accumulate_unit_roundoff / _NUDGE
    return np.maximum(delta, spread) * factor
