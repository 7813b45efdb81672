"""The op registry: ops by name, the process's :data:`OPS`, :func:`op` to register a user
op, the TF32 policy, and which error model an op's gate uses."""

from __future__ import annotations

import difflib
import threading
import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from pytest_arbiter.core.candidates import REGISTRY, definition_site
from pytest_arbiter.core.changes import Listeners
from pytest_arbiter.core.dtypes import dtype_name, precision
from pytest_arbiter.core.names import check_name
from pytest_arbiter.core.ops.accuracy import BudgetFn, ErrorModel
from pytest_arbiter.core.ops.arrays import Reference
from pytest_arbiter.core.ops.definition import Op
from pytest_arbiter.core.ops.matmul import (
    matmul_budget,
    matmul_budget_tf32,
    matmul_model,
    matmul_op,
)
from pytest_arbiter.core.ops.softmax import softmax_model, softmax_op
from pytest_arbiter.core.ops.user import default_budget, default_model, make_op
from pytest_arbiter.core.user_inputs import UserGateInputs
from pytest_arbiter.errors import UnknownOpWarning


def _origin(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{module}.{qualname}"


def _same_function(old: Any, new: Any) -> bool:
    """Whether ``new`` is ``old``, or the same code made again (a function defined in a
    fixture, made anew for each test): one code object, equal defaults, the same
    objects in its closure."""
    if old is new:
        return True
    if not (isinstance(old, types.FunctionType) and isinstance(new, types.FunctionType)):
        return False
    cells = zip(old.__closure__ or (), new.__closure__ or (), strict=False)
    return (old.__code__ is new.__code__ and old.__defaults__ == new.__defaults__
            and old.__kwdefaults__ == new.__kwdefaults__
            and len(old.__closure__ or ()) == len(new.__closure__ or ())
            and all(_cell(a) is _cell(b) for a, b in cells))


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _reimported(old: Any, new: Any) -> bool:
    """Whether ``new`` is ``old``'s code from a fresh import of its module (pytester's
    in-process runs re-import a test module); two lambdas of one module are two."""
    return (_origin(old) == _origin(new)
            and getattr(old, "__globals__", None) is not getattr(new, "__globals__", None))


class OpRegistry:
    """Ops by name; the built-in ``matmul`` and ``softmax`` are always present.

    ``watch``: the first :meth:`get` after the candidate registry changed warns
    (:class:`UnknownOpWarning`) once per candidate registered for an op unknown here
    (the process's registry watches :data:`~pytest_arbiter.core.candidates.REGISTRY`).
    """

    def __init__(self, *, watch: bool = False) -> None:
        self._ops: dict[str, Op] = {}
        self._lock = threading.Lock()
        self.generation = 0
        """Counts the ops replaced: a key plan made with an older one is made again."""
        self.changed = Listeners()
        """Fired when an op is replaced (re-registered, or its TF32 allowance changed):
        the arbiters' plans and gate verdicts were made with the old definition."""
        self._watch = watch
        self._seen_generation = -1
        self._warned: set[str] = set()
        for builtin in _builtin_ops():
            self._ops[builtin.name] = builtin

    def register(self, op: Op) -> Op:
        check_name("op", op.name)
        with self._lock:
            existing = self._ops.get(op.name)
            if existing is not None and existing.builtin:
                raise ValueError(f"op {op.name!r} is built in and cannot be redefined")
            if (existing is not None
                    and not _same_function(existing.reference, op.reference)
                    and not _reimported(existing.reference, op.reference)):
                raise ValueError(
                    f"op {op.name!r} is already registered with reference "
                    f"{_origin(existing.reference)}; it cannot be re-registered with "
                    f"reference {_origin(op.reference)}")
            # the same reference, or a re-import of its defining module, replaces it
            self._ops[op.name] = op
            replaced = existing is not None and not _same_definition(existing, op)
            if replaced:
                self.generation += 1
        if replaced:
            self.changed.fire()
        return op

    def get(self, name: str) -> Op:
        if self._watch and self._seen_generation != REGISTRY.generation:
            self._warn_unknown()
        try:
            return self._ops[name]
        except KeyError:
            close = difflib.get_close_matches(name, sorted(self._ops), n=3, cutoff=0.6)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            known = ", ".join(sorted(self._ops))
            raise KeyError(f"unknown op {name!r}{hint}; registered ops: {known}") from None

    def unknown_op_lines(self) -> list[str]:
        """One line per registered candidate whose op is unknown here: its name, where it
        is defined, and the known op names closest to its op's."""
        known = set(self._ops)
        return [_unknown_line(c.name, c.op, definition_site(c), known)
                for c in REGISTRY.registered() if c.op not in known]

    def _warn_unknown(self) -> None:
        self._seen_generation = REGISTRY.generation
        known = set(self._ops)
        for cand in REGISTRY.registered():
            if cand.op not in known and cand.name not in self._warned:
                self._warned.add(cand.name)
                warnings.warn(UnknownOpWarning(_unknown_line(
                    cand.name, cand.op, definition_site(cand), known)), stacklevel=3)

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def names(self) -> list[str]:
        return sorted(self._ops)

    def set_tf32(self, name: str, dtype: str, allow: bool) -> Op:
        """Replace op ``name`` with one whose budget does (or does not) accept kernels that
        round ``dtype`` inputs to TF32; see :func:`allow_tf32`."""
        if name not in _TF32_BUDGETS:
            raise ValueError(f"op {name!r} has no TF32 budget; a user op that accepts TF32 "
                             "passes its own budget=... to op()")
        if dtype_name(dtype) != "float32":
            raise ValueError(f"TF32 rounds float32 inputs, not {dtype}: float16 and bfloat16 "
                             "inputs already have at most TF32's precision")
        with self._lock:
            current = self.get(name)
            dtypes = current.allow_tf32 | {"float32"} if allow else frozenset()
            plain, tf32 = _TF32_BUDGETS[name]
            updated = replace(current, allow_tf32=frozenset(dtypes),
                              budget=tf32 if dtypes else plain)
            self._ops[name] = updated
            self.generation += 1
        self.changed.fire()
        return updated


DEFINING = ("reference", "validate", "budget", "gate_inputs", "builtin", "out_dtype",
            "allow_tf32", "user_gate_inputs")
"""What defines an op for its gate (``region_of`` and ``exact`` are made from its name
and reference)."""


def _same_definition(a: Op, b: Op) -> bool:
    """Whether ``b`` registers what ``a`` did (an ``op()`` call repeated in a fixture):
    no change for the arbiters to plan and gate again."""
    return all(_same_function(getattr(a, name), getattr(b, name))
               or getattr(a, name) == getattr(b, name) for name in DEFINING)


def _builtin_ops() -> list[Op]:
    return [matmul_op(), softmax_op()]


_TF32_BUDGETS: dict[str, tuple[BudgetFn, BudgetFn]] = {
    "matmul": (matmul_budget, matmul_budget_tf32)}

def _unknown_line(name: str, op_name: str, where: str, known: set[str]) -> str:
    close = difflib.get_close_matches(op_name, sorted(known), n=3, cutoff=0.6)
    hint = f"; closest known: {', '.join(close)}" if close else (
        f"; known ops: {', '.join(sorted(known))}")
    return (f"candidate {name!r} ({where}) is registered for op {op_name!r}, which no "
            f"op() registers and no built-in has: it is never used{hint}")


OPS = OpRegistry(watch=True)


def unknown_op_lines() -> list[str]:
    """The run summary's lines on candidates for unknown ops (see :class:`OpRegistry`)."""
    return OPS.unknown_op_lines()


def allow_tf32(op_name: str = "matmul", dtype: str = "float32", *, allow: bool = True) -> Op:
    """Accept kernels of ``op_name`` that round ``dtype`` inputs to TF32 (a GPU default for
    float32 GEMMs), in every gate of this process; ``allow=False`` takes it back.

    Off by default: the float32 budget fails such a kernel. A team that accepts TF32 says
    so once, before the first dispatch (a ``conftest.py``). The TF32 budget adds the input
    rounding, truncation included, to the float32 one (docs/accuracy.md, "TF32").
    """
    return OPS.set_tf32(op_name, dtype, allow)


def error_model(op: Op, inputs: Sequence[np.ndarray], exact: np.ndarray, *,
                generated: bool, out_dtype: str | None = None,
                reference_dtype: str | None = None) -> ErrorModel | None:
    """The :class:`ErrorModel` of a built-in op for ``inputs`` (host arrays) and their
    exact result; ``generated``: the gate drew the inputs itself (i.i.d. random values),
    so the sharper random-data bounds hold.

    A user op with the default budget whose reference returned ``reference_dtype``, more
    precise than the floating ``out_dtype`` its kernels return, gets the default budget
    with half an ulp for the output's rounding (:func:`default_model`). ``None`` for any
    other user op: its ``budget`` is all there is.
    """
    if not op.builtin:
        if (op.budget is default_budget and out_dtype is not None
                and reference_dtype is not None
                and precision(reference_dtype).unit_roundoff
                < precision(out_dtype).unit_roundoff):
            return default_model(inputs, exact, out_dtype, reference_dtype)
        return None
    if op.name == "matmul":
        tf32 = dtype_name(inputs[0].dtype) in op.allow_tf32
        return matmul_model(inputs, exact, generated=generated, tf32=tf32)
    if op.name == "softmax":
        return softmax_model(inputs, exact, generated=generated)
    return None


def op(name: str, *, reference: Reference | None = None,
       validate: Callable[..., None] | None = None,
       budget: BudgetFn | None = None, out_dtype: Any = None,
       gate_inputs: UserGateInputs | None = None) -> Any:
    """Register a new op ``name`` whose reference is ``reference``.

    Call it (``op("axpy", reference=fn)``) or use it as a decorator on the reference
    (``@op("axpy")``). ``validate(*inputs)`` raises ``ValueError`` for inputs the op does
    not take, before any kernel runs (default: arrays of boolean, integer or floating
    dtype, and plain numbers). ``budget(inputs, exact)`` may give the allowed absolute
    error per output element; the default is documented in ``docs/accuracy.md`` (integer
    and boolean outputs: exact). ``gate_inputs(inputs, rng)`` returns a list of extra
    input tuples for the gate, made from one dispatch's inputs with the seeded
    ``numpy.random.Generator`` ``rng``; the gate adds trials it derives itself. The reference
    may compute in any precision: outputs are expected in :func:`result_dtype`, or in
    ``out_dtype`` (a dtype name or NumPy dtype) when given. Registering ``name`` again
    with another reference is ``ValueError``; a re-import of the same code is not.
    """
    if reference is not None:
        return OPS.register(make_op(name, reference, validate=validate, budget=budget,
                                    out_dtype=out_dtype, gate_inputs=gate_inputs))

    def decorate(fn: Reference) -> Reference:
        OPS.register(make_op(name, fn, validate=validate, budget=budget, out_dtype=out_dtype,
                             gate_inputs=gate_inputs))
        return fn

    return decorate
