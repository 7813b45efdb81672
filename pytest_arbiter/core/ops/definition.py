"""The :class:`Op` type: a kind of work with one reference semantics, and the dtype its
outputs must have."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_arbiter.core.ops.accuracy import BudgetFn
from pytest_arbiter.core.ops.arrays import (
    Array,
    Reference,
    dtype_of,
    first_float,
    is_float,
    like,
    same_device_kind,
    to_host,
)
from pytest_arbiter.core.regions import Region
from pytest_arbiter.core.user_inputs import UserGateInputs


@dataclass(frozen=True)
class Op:
    """A kind of work with one reference semantics.

    ``reference`` computes the result (for the built-in ops in the inputs' dtype; a user
    op's may compute in any precision, :meth:`run_reference` casts it to
    :func:`result_dtype`); ``exact`` returns the float64 ground truth the gate uses.
    ``out_dtype``, when set, is the dtype every output of the op must have.
    """

    name: str
    reference: Reference
    validate: Callable[..., None]
    region_of: Callable[..., Region]
    exact: Callable[..., np.ndarray]
    budget: BudgetFn
    gate_inputs: Callable[[Region, int], list[tuple[np.ndarray, ...]]] | None = None
    builtin: bool = False
    doc: str = field(default="", compare=False)
    out_dtype: np.dtype | None = None
    allow_tf32: frozenset[str] = frozenset()
    """The input dtypes for which a kernel may round its inputs to TF32 (see
    :func:`allow_tf32`); empty by default, so a float32 GEMM on TF32 fails the gate."""
    user_gate_inputs: UserGateInputs | None = None
    """A user op's ``gate_inputs(inputs, rng)``: extra input tuples made from one
    dispatch's inputs; ``None``: the gate derives its own (:mod:`pytest_arbiter.core.user_inputs`).
    Built-in ops generate theirs from a region (:attr:`gate_inputs`)."""

    def run_reference(self, *inputs: Array) -> Array:
        """The reference's result in :func:`result_dtype`, on the inputs' kind of device.

        This is what a dispatch returns when the reference runs.
        """
        out = self.reference(*inputs)
        if self.builtin:
            return out
        if isinstance(out, tuple):  # several outputs: each as one, a tuple as candidates give
            return tuple(self._as_result(inputs, part) for part in out)
        return self._as_result(inputs, out)

    def _as_result(self, inputs: tuple[Array, ...], out: Any) -> Array:
        """One reference output in :func:`result_dtype`, on the inputs' kind of device."""
        want = result_dtype(self, inputs, out)
        template = inputs[0] if inputs else out
        if same_device_kind(out, template) and hasattr(out, "astype"):
            return out if np.dtype(out.dtype) == want else out.astype(want)
        return like(np.asarray(to_host(out)).astype(want), template)


def result_dtype(op: Op, inputs: Sequence[Any], reference_out: Any) -> np.dtype:
    """The dtype a candidate's output must have for ``inputs``, given the reference's output.

    The op's declared ``out_dtype`` if any; else, when the reference output is floating
    point (bfloat16 included), the dtype of the first floating-point array input (a float64
    reference of float32 inputs expects float32; an index array before it does not count);
    else the reference output's own dtype (an argmax returning int64 stays int64).
    Built-in ops: the first input's dtype.
    """
    if op.out_dtype is not None:
        return op.out_dtype
    if op.builtin and inputs:
        return dtype_of(inputs[0])
    ref = dtype_of(reference_out)
    if is_float(ref):
        first = first_float(inputs)
        if first is not None:
            return first
    return ref
