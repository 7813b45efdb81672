"""Ops whose result is a scalar (a dot product, a norm, a full reduction) and 0-d or
plain-number inputs: gated, timed and served like any other, in every mode."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pytest_arbiter import Arbiter, ComparePolicy, MeasureCache
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.ops import OpRegistry, make_op

POLICY = ComparePolicy(min_rounds=7, max_rounds=20, budget_s=0.005)


def exact_dot(x: Any, y: Any) -> Any:
    return np.dot(np.asarray(x, np.float64), np.asarray(y, np.float64))


def wrong_dot(x: Any, y: Any) -> Any:
    return np.dot(x[:-1], y[:-1])  # drops the last product


def arbiter(mode: str) -> Arbiter:
    ops = OpRegistry()
    ops.register(make_op("s_dot", exact_dot))
    ops.register(make_op("s_sqrt", np.sqrt))
    reg = CandidateRegistry()
    reg.extend([FunctionCandidate(wrong_dot, "s_wrong", "s_dot", "cpu", 9, None, None),
                FunctionCandidate(np.dot, "s_npdot", "s_dot", "cpu", 1, None, None),
                FunctionCandidate(lambda x, y: (x * y).sum(), "s_mulsum", "s_dot", "cpu",
                                  0, None, None),
                FunctionCandidate(np.sqrt, "s_npsqrt", "s_sqrt", "cpu", 0, None, None)])
    return Arbiter(registry=reg, ops=ops, cache=MeasureCache(), mode=mode, policy=POLICY)


@pytest.mark.parametrize("mode", ["static", "tune"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_scalar_result_is_gated_and_served(mode: str, dtype: str) -> None:
    arb = arbiter(mode)
    x = np.arange(1.0, 11.0, dtype=dtype)
    y = np.ones(10, dtype=dtype)
    out = arb.dispatch("s_dot", x, y)
    assert np.ndim(out) == 0 and float(out) == 55.0
    counts = arb.histogram.counts()
    assert counts[("cpu", "s_dot", "s_wrong", "rejected")] >= 1, counts
    assert sum(v for k, v in counts.items() if k[3] == "won") == 1, counts


@pytest.mark.parametrize("value", [np.float32(4.0), np.array(4.0), 4.0],
                         ids=["numpy-scalar", "0-d", "python-float"])
def test_a_scalar_input_gives_a_scalar_output(value: Any) -> None:
    arb = arbiter("static")
    assert float(arb.dispatch("s_sqrt", value, target="cpu")) == 2.0
    assert arb.histogram.counts() == {("cpu", "s_sqrt", "s_npsqrt", "won"): 1}


def test_a_scalar_result_of_another_shape_fails_and_keeps_its_budget() -> None:
    """The reference's 0-d result is judged as one element, but the output's shape is
    held to the reference's: (1,) where it is () fails. And the budget of a scalar
    result is the one-element result's, ill-conditioned trials' sensitivity included."""
    from pytest_arbiter.core.gate import evaluate

    def var(x: Any) -> Any:
        return np.var(np.asarray(x, np.float64))

    scalar = make_op("s_var0", var)
    single = make_op("s_var1", lambda x: np.atleast_1d(var(x)))
    x = np.random.default_rng(3).standard_normal(1000).astype(np.float32) + 1000.0
    cand0 = FunctionCandidate(lambda v: np.var(v), "s_var_0d", "s_var0", "cpu", 0, None,
                              None)
    cand1 = FunctionCandidate(lambda v: np.atleast_1d(np.var(v)), "s_var_1", "s_var1",
                              "cpu", 0, None, None)
    zero_d, one = evaluate(cand0, scalar, inputs=[x]), evaluate(cand1, single, inputs=[x])
    assert [t.worst_ratio for t in zero_d.trials] == pytest.approx(
        [t.worst_ratio for t in one.trials])
    wrong = FunctionCandidate(lambda v: np.atleast_1d(np.var(v)), "s_var_wrong", "s_var0",
                              "cpu", 0, None, None)
    report = evaluate(wrong, scalar, inputs=[x])
    assert not report.passed and "output shape (1,), reference shape ()" in report.reason


def scaled(a: Any, x: Any) -> Any:
    return np.multiply(a, x)


@pytest.mark.parametrize("mode", ["static", "tune"])
def test_a_plain_number_before_the_array_needs_no_target(mode: str) -> None:
    """The target is the first array's: a scale factor passed first lives nowhere."""
    ops = OpRegistry()
    ops.register(make_op("s_scale", scaled))
    reg = CandidateRegistry()
    reg.extend([FunctionCandidate(scaled, "s_mul", "s_scale", "cpu", 0, None, None)])
    arb = Arbiter(registry=reg, ops=ops, cache=MeasureCache(), mode=mode, policy=POLICY)
    out = arb.dispatch("s_scale", 2.0, np.arange(4.0))
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0]
    assert arb.histogram.counts() == {("cpu", "s_scale", "s_mul", "won"): 1}
    with pytest.raises(ValueError, match=r"cannot tell which target a .*Opaque"):
        arb.dispatch("s_scale", 2.0, Opaque())


class Opaque:
    """An input of an array package no backend knows."""

    shape = (2,)
    ndim = 1
    dtype = np.dtype("float64")
