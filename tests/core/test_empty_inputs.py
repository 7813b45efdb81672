"""Empty problems in the F4 gate: an empty output has no value to check, so the gate
checks its shape and dtype on the dispatch's own inputs and builds no trial from a zero
dimension; a region alone with one is refused with a clear error (docs/contract.md,
"Empty inputs")."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pytest_arbiter import MatmulRegion, SoftmaxRegion, f4_gate
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.gate import GATE_SEED
from pytest_arbiter.core.ops import OPS
from pytest_arbiter.core.regions import Region
from pytest_arbiter.session.fixture import gate_matrix

EMPTY_REGIONS = [
    MatmulRegion.of(0, 8, 16, "float32"),
    MatmulRegion.of(4, 0, 16, "float64"),
    MatmulRegion.of(0, 0, 0, "float16"),
    SoftmaxRegion.of((0, 16), "float32"),
    SoftmaxRegion.of((2, 0, 16), "float64"),
    SoftmaxRegion.of((0, 3, 5), "float16"),
]


def cand(fn: Any, op: str = "matmul") -> FunctionCandidate:
    return FunctionCandidate(fn, fn.__name__, op, "cpu", 0, None, None)


@pytest.mark.parametrize("region", EMPTY_REGIONS, ids=lambda r: r.describe())
def test_an_empty_region_generates_no_trial(region: Region) -> None:
    gate_inputs = OPS.get(region.op).gate_inputs
    assert gate_inputs is not None
    assert gate_inputs(region, GATE_SEED) == []


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_k0_region_is_gated_in_full(registry: CandidateRegistry, dtype: str) -> None:
    region = MatmulRegion.of(4, 8, 0, dtype)
    gate_inputs = OPS.get("matmul").gate_inputs
    assert gate_inputs is not None
    generated = gate_inputs(region, GATE_SEED)
    assert len(generated) > 1
    report = f4_gate(registry.get("blas_matmul"), OPS.get("matmul"), region=region)
    assert report.passed, report.summary()
    assert len(report.trials) == len(generated)


EMPTY_INPUTS = [
    ("matmul", (np.zeros((0, 16)), np.zeros((16, 8)))),
    ("matmul", (np.zeros((4, 16)), np.zeros((16, 0)))),
    ("softmax", (np.zeros((0, 16)),)),
    ("softmax", (np.zeros((2, 0, 16)),)),
]


def _ids(case: tuple[str, tuple[np.ndarray, ...]]) -> str:
    return f"{case[0]}-" + "-".join("x".join(map(str, x.shape)) for x in case[1])


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("case", EMPTY_INPUTS, ids=_ids)
def test_a_correct_kernel_passes_on_empty_inputs_by_shape_and_dtype(
        registry: CandidateRegistry, case: tuple[str, tuple[np.ndarray, ...]],
        dtype: str) -> None:
    op, arrays = case
    inputs = [x.astype(dtype) for x in arrays]
    for cand_ in registry.for_op(op, "cpu"):
        report = f4_gate(cand_, OPS.get(op), inputs=inputs)
        if cand_.name == "panel_matmul":  # it declines K % 256 != 0
            assert not report.passed and report.trials[0].status == "declined"
            continue
        assert report.passed, report.summary()
        assert [t.status for t in report.trials] == ["pass"]
        assert report.trials[0].input == "the dispatch's own inputs"


def one_row_too_many(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.zeros((a.shape[0] + 1, b.shape[1]), dtype=a.dtype)


def widened(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a, b).astype(np.float64)


@pytest.mark.parametrize(("kernel", "needle"), [
    (one_row_too_many, "output shape (1, 8), reference shape (0, 8)"),
    (widened, "output dtype float64, expected float32"),
])
def test_a_wrong_kernel_fails_on_empty_inputs(kernel: Any, needle: str) -> None:
    a, b = np.zeros((0, 16), np.float32), np.zeros((16, 8), np.float32)
    report = f4_gate(cand(kernel), OPS.get("matmul"), inputs=(a, b))
    assert not report.passed and report.rejected
    assert report.failing is not None and needle in report.failing.reason


@pytest.mark.parametrize("shape", [(0,), (3, 0)], ids=str)
def test_a_user_op_with_a_wider_reference_is_gated_on_empty_inputs(
        shape: tuple[int, ...]) -> None:
    from pytest_arbiter.core.ops import make_op

    op = make_op("wide_double", lambda x: x.astype(np.float64) * 2,
                 gate_inputs=lambda inputs, rng: [
                     (rng.standard_normal(inputs[0].shape).astype(np.float32),)])

    def doubled(x: np.ndarray) -> np.ndarray:
        return x * 2

    report = f4_gate(cand(doubled, "wide_double"), op, inputs=(np.zeros(shape, np.float32),))
    assert report.passed, report.summary()


@pytest.mark.parametrize("region", EMPTY_REGIONS, ids=lambda r: r.describe())
def test_a_gate_on_an_empty_region_alone_is_refused(registry: CandidateRegistry,
                                                    region: Region) -> None:
    name = "blas_matmul" if region.op == "matmul" else "stable_softmax"
    with pytest.raises(ValueError, match="has an empty output: a gate on the region alone "
                                         "has nothing to check") as raised:
        f4_gate(registry.get(name), OPS.get(region.op), region=region)
    assert region.describe() in str(raised.value)


@pytest.mark.parametrize(("op", "shape"), [
    ("matmul", (0, 8, 8)), ("matmul", (8, 0, 8)), ("matmul", (8, 8, 0)),
    ("softmax", (0, 16)), ("softmax", (2, 0, 16)), ("softmax", ()),
])
def test_gate_matrix_refuses_a_zero_dimension_at_collection(
        op: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"shape \(.*\) has a dimension below 1"):
        gate_matrix(op, [(16, 16, 16) if op == "matmul" else (4, 16), shape], ["float32"])


@pytest.mark.parametrize(("op", "inputs", "needle"), [
    ("softmax", (np.ones((), np.float32),),
     "softmax needs an array with a non-empty last axis, got a 0-d array"),
    ("softmax", (np.ones((4, 0), np.float32),),
     "softmax needs an array with a non-empty last axis, got 4x0"),
    ("matmul", (np.ones((), np.float32), np.ones((4, 4), np.float32)),
     "matmul needs 2-D A (MxK) and B (KxN): A is a 0-d array, B is 4x4"),
])
def test_refused_inputs_name_their_shape(op: str, inputs: tuple[Any, ...], needle: str) -> None:
    with pytest.raises(ValueError) as raised:
        OPS.get(op).validate(*inputs)
    assert str(raised.value) == needle
