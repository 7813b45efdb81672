"""The F4 gate cases of the GPU candidates, shared by the live gates and the emulated ones."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_arbiter.core.ops import OPS
from pytest_arbiter.core.regions import MatmulRegion, Region, SoftmaxRegion
from pytest_arbiter.decision.gating import f4_gate
from pytest_arbiter.runtime import cuda
from pytest_arbiter.runtime.cuda.lane import GpuCandidate, bfloat16_problem

# aligned, and with partial 128-wide tiles along M and N (272 = 2*128 + 16, 136 = 128 + 8)
MATMUL_SHAPES = [(256, 128, 64), (272, 136, 96)]
SOFTMAX_SHAPES = [(64, 1000), (2, 3, 4097)]


def gate_cases(target: str, lane: str | None = None) -> list[Any]:
    """``(name, dtype, shape)`` params for every GPU candidate of ``target`` (and ``lane``)."""
    out = []
    for cand in cuda.candidates():
        if cand.target != target or not isinstance(cand, GpuCandidate):
            continue
        if lane is not None and cand.lane != lane:
            continue
        shapes: list[tuple[int, ...]] = list(
            MATMUL_SHAPES if cand.op == "matmul" else SOFTMAX_SHAPES)
        for dtype in cand.dtypes:
            for shape in shapes:
                ident = f"{cand.name}-{dtype}-{'x'.join(map(str, shape))}"
                out.append(pytest.param(cand.name, dtype, shape, id=ident))
    return out


def gpu_candidate(name: str) -> GpuCandidate:
    found = {c.name: c for c in cuda.candidates() if isinstance(c, GpuCandidate)}
    return found[name]


def region_of(op: str, shape: tuple[int, ...], dtype: str) -> Region:
    if op == "matmul":
        m, n, k = shape
        return MatmulRegion.of(m, n, k, dtype)
    return SoftmaxRegion.of(shape, dtype)


def run_gate(name: str, dtype: str, shape: tuple[int, ...]) -> None:
    """The F4 gate of candidate ``name`` on ``shape``; fails the test with its report."""
    cand = gpu_candidate(name)
    if dtype == "bfloat16" and bfloat16_problem() is not None:
        pytest.skip(str(bfloat16_problem()))
    assert cand.available(), cand.unavailable_reason()
    report = f4_gate(cand, OPS.get(cand.op), region=region_of(cand.op, shape, dtype))
    assert report.passed, report.summary()
    checked = [t for t in report.trials if t.status == "pass"]
    assert len(checked) >= 3, report.summary()  # only the ragged neighbour may be declined
