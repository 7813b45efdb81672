"""Ops: each kind of work's reference, input validation, regions, gate inputs and budget.

Validation runs before any candidate or reference touches the inputs: it reads only
``ndim``, ``shape`` and ``dtype``, so it works on NumPy and CuPy arrays alike and
allocates nothing.

The modules, each importing only those above it in this list: :mod:`.arrays` (what an op
reads of its inputs), :mod:`.accuracy` (the error model budgets are built from),
:mod:`.definition` (the :class:`Op` type), :mod:`.gate_inputs` (what the built-in ops'
generated inputs share), one module per built-in op (:mod:`.matmul`, :mod:`.softmax`),
:mod:`.user` (the defaults of a user op), and :mod:`.registry` (ops by name, :func:`op`,
the TF32 policy). Import the names from here.
"""

from __future__ import annotations

from pytest_arbiter.core.dtypes import numpy_dtype
from pytest_arbiter.core.ops.accuracy import (
    ERROR_LAMBDA,
    TF32_UNIT_ROUNDOFF,
    BudgetFn,
    ErrorModel,
    ErrorScales,
)
from pytest_arbiter.core.ops.arrays import Array, Reference, to_host
from pytest_arbiter.core.ops.definition import Op, result_dtype
from pytest_arbiter.core.ops.gate_inputs import TAILS, GateInputs
from pytest_arbiter.core.ops.registry import (
    OPS,
    OpRegistry,
    allow_tf32,
    error_model,
    op,
    unknown_op_lines,
)
from pytest_arbiter.core.ops.user import (
    accumulation_length,
    compares_exactly,
    input_label,
    inputs_label,
    make_op,
)

__all__ = [
    "ERROR_LAMBDA",
    "OPS",
    "TAILS",
    "TF32_UNIT_ROUNDOFF",
    "Array",
    "BudgetFn",
    "ErrorModel",
    "ErrorScales",
    "GateInputs",
    "Op",
    "OpRegistry",
    "Reference",
    "accumulation_length",
    "allow_tf32",
    "compares_exactly",
    "error_model",
    "input_label",
    "inputs_label",
    "make_op",
    "numpy_dtype",
    "op",
    "result_dtype",
    "to_host",
    "unknown_op_lines",
]
