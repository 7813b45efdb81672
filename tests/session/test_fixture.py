"""The ``arbiter`` fixture as a plain object (no pytest): a gate failure calls ``fail``
with the summary, dispatches are recorded, ``expect_degrade`` calls back; and the ids and
regions ``gate_matrix`` parametrizes."""

from __future__ import annotations

from typing import NoReturn

import numpy as np
import pytest

from pytest_arbiter import gate_matrix
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.decision.arbiter import Arbiter
from pytest_arbiter.runtime import register_bundled
from pytest_arbiter.session.fixture import ArbiterFixture, GateCase


class _Failed(Exception):
    pass


def _fail(msg: str) -> NoReturn:
    raise _Failed(msg)


def test_fixture_gate_failure_calls_fail_with_the_summary(registry: CandidateRegistry) -> None:
    registry.add(FunctionCandidate(lambda a, b: np.zeros((a.shape[0], b.shape[1]), a.dtype),
                                   "fixture_zeros", "matmul", "cpu", 5, None, None))
    fx = ArbiterFixture(Arbiter(registry=registry, mode="static"), fail=_fail)
    a = np.ones((8, 4), np.float32)
    b = np.ones((4, 8), np.float32)
    assert fx.gate("blas_matmul", a, b).passed
    with pytest.raises(_Failed, match="F4 gate FAILED: candidate 'fixture_zeros'"):
        fx.gate("fixture_zeros", a, b)


def test_fixture_dispatch_records_and_expect_degrade_calls_back(
        registry: CandidateRegistry) -> None:
    called: list[bool] = []
    fx = ArbiterFixture(Arbiter(registry=registry, mode="static"), fail=_fail,
                        expect_degrade=lambda: called.append(True))
    fx.dispatch("matmul", np.ones((2, 3), np.float32), np.ones((3, 2), np.float32))
    assert fx.histogram(op="matmul") == {("cpu", "matmul", "blas_matmul", "won"): 1}
    fx.expect_degrade()
    assert called == [True] and fx.expected_degrade


def test_gate_matrix_of_a_user_op_is_refused_at_collection() -> None:
    """It generates inputs for the built-in ops only: a user op is refused when the test
    module is collected, naming what to do instead, not in every case's test body."""
    with pytest.raises(ValueError, match=r"gate_matrix\('row_lse', \.\.\.\): .* "
                       r"arbiter\.gate\(candidate_name, \*inputs\)"):
        gate_matrix("row_lse", [(32, 64)], ["float32"], registry=CandidateRegistry())


def test_gate_matrix_ids_and_regions() -> None:
    reg = CandidateRegistry()
    register_bundled(reg)
    cases = gate_matrix("matmul", [(32, 16, 32), (24, 16, 32)], ["float32", "float16"],
                        registry=reg)
    ids = [c.id for c in cases]
    assert "blas_matmul-32x16x32-float32" in ids
    assert "dot_matmul-24x16x32-float16" in ids
    assert len(ids) == len(set(ids)) == len(reg.for_op("matmul")) * 2 * 2
    cpu_ids = [c.id for c in gate_matrix("matmul", [(32, 16, 32), (24, 16, 32)],
                                         ["float32", "float16"], target="cpu", registry=reg)]
    assert len(cpu_ids) == 3 * 2 * 2 and set(cpu_ids) <= set(ids)
    region = GateCase("matmul", "blas_matmul", (24, 16, 32), "float32").region()
    assert (region.shapes, region.dtype) == (((24, 32), (32, 16)), "float32")
    soft = GateCase("softmax", "stable_softmax", (4, 10), "float32").region()
    assert soft.shapes == ((4, 10),)
