"""Trial 7's F4 gate findings on users' own ops: a candidate's outputs must be packed as
the reference's are (a tuple where it returns one array was passed and served, and the
caller's ``out.shape`` raised), integer outputs are compared and printed as exact
integers, and a failing input is described with its numbers' values and its layout.
Each test fails on the gate before these fixes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pytest_arbiter import Arbiter, HistogramKey, MeasureCache, f4_gate
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.gate import GateReport
from pytest_arbiter.core.ops import Op, OpRegistry, make_op

X = np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32)


def _gate(fn: Callable[..., Any], op: Op, *inputs: Any) -> GateReport:
    cand = FunctionCandidate(fn, "kernel", op.name, "cpu", 0, None, None)
    return f4_gate(cand, op, inputs=inputs)


# -- 1: how the outputs are packed --------------------------------------------------------

def _minmax_ref(x: np.ndarray) -> np.ndarray:
    w = x.astype(np.float64)
    return np.stack([w.min(-1), w.max(-1)])


def _meanvar_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = x.astype(np.float64)
    m = w.mean(-1)
    return m, ((w - m[..., None]) ** 2).mean(-1)


def _meanvar(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m, v = _meanvar_ref(x)
    return m.astype(x.dtype), v.astype(x.dtype)


MINMAX = make_op("t_minmax", _minmax_ref)
MEANVAR = make_op("t_meanvar", _meanvar_ref)


@pytest.mark.parametrize(("op", "kernel", "returned", "reference"), [
    (MINMAX, lambda x: (x.min(-1), x.max(-1)), "a tuple of 2 arrays", "one array"),
    (MINMAX, lambda x: [x.min(-1), x.max(-1)], "a list of 2 arrays", "one array"),
    (MEANVAR, lambda x: np.stack(_meanvar(x)), "one array", "a tuple of 2 arrays"),
    (MEANVAR, lambda x: list(_meanvar(x)), "a list of 2 arrays", "a tuple of 2 arrays"),
    (MEANVAR, lambda x: (*_meanvar(x), _meanvar(x)[1]), "a tuple of 3 arrays",
     "a tuple of 2 arrays"),
    (MEANVAR, lambda x: _meanvar(x)[:1], "a tuple of 1 array", "a tuple of 2 arrays"),
], ids=["tuple-for-array", "list-for-array", "array-for-tuple", "list-for-tuple",
        "three-for-two", "one-for-two"])
def test_outputs_packed_otherwise_than_the_reference_fail(
        op: Op, kernel: Callable[..., Any], returned: str, reference: str) -> None:
    """Before: a tuple of the right values (or a list, or one stacked array) passed,
    stacked like the reference's; another count failed on the stacked shape alone."""
    report = _gate(kernel, op, X)
    assert not report.passed and report.rejected
    failing = report.failing
    assert failing is not None and failing.status == "fail"
    assert failing.failure == "structure"
    assert report.reason == f"returned {returned}; the reference returns {reference}"


def test_outputs_packed_as_the_reference_pass() -> None:
    assert _gate(lambda x: _minmax_ref(x).astype(x.dtype), MINMAX, X).passed
    assert _gate(_meanvar, MEANVAR, X).passed


@pytest.mark.parametrize("kernel", [lambda x: np.float32(x.sum(dtype=np.float64)),
                                    lambda x: np.array(x.sum(dtype=np.float64), np.float32),
                                    lambda x: x.sum(dtype=np.float64).astype(np.float32)],
                         ids=["numpy-scalar", "0-d", "numpy-scalar-astype"])
@pytest.mark.parametrize("ref", [lambda x: x.astype(np.float64).sum(),
                                 lambda x: np.array(x.astype(np.float64).sum())],
                         ids=["scalar-ref", "0-d-ref"])
def test_a_scalar_and_a_0d_array_are_one_array(kernel: Callable[..., Any],
                                               ref: Callable[..., Any]) -> None:
    """The contract tells a NumPy scalar and a 0-d array apart nowhere: both are one."""
    report = _gate(kernel, make_op("t_total", ref), X)
    assert report.passed, report.summary()


def test_a_tuple_candidate_is_passed_over_and_the_caller_gets_one_array() -> None:
    """Trial 7's ``e7_minmax``: the dispatch was served the tuple, ``out.shape`` raised."""
    ops = OpRegistry()
    ops.register(make_op("t_minmax2", _minmax_ref))
    reg = CandidateRegistry()
    reg.extend([FunctionCandidate(lambda x: (x.min(-1), x.max(-1)), "t_mm_tuple",
                                  "t_minmax2", "cpu", 5, None, None)])
    arb = Arbiter(registry=reg, ops=ops, cache=MeasureCache(), mode="static")
    out = arb.dispatch("t_minmax2", X)
    assert isinstance(out, np.ndarray) and out.shape == (2, 6)
    assert arb.histogram.counts()[
        HistogramKey("cpu", "t_minmax2", "t_mm_tuple", "rejected")] == 1


# -- 2: integer outputs, exact ------------------------------------------------------------

BIG = np.random.default_rng(3).integers(2**40, 2**55, (4, 64)).astype(np.int64)


def _isum(x: np.ndarray) -> np.ndarray:
    return x.sum(-1, dtype=np.int64)


def test_an_integer_mismatch_prints_both_exact_integers() -> None:
    """Before: ``got 1097568240213038976, reference 1.09757e+18``."""
    report = _gate(lambda x: x.astype(np.float64).sum(-1).astype(np.int64),
                   make_op("t_isum", _isum), BIG)
    assert not report.passed and report.failing is not None
    assert report.failing.failure == "values"
    ref = _isum(BIG)
    got = BIG.astype(np.float64).sum(-1).astype(np.int64)
    at = int(np.argmax(got != ref))
    assert (f"first at ({at},): got {got[at]}, reference {ref[at]} "
            f"(off by {got[at] - ref[at]:+d})") in report.reason


def test_an_integer_off_by_one_past_2_53_fails() -> None:
    """Before: compared in float64, where 2^60 + 1 is 2^60, it passed."""
    x = np.full((2, 4), 2**58, np.int64)

    def off_by_one(v: np.ndarray) -> np.ndarray:
        out = _isum(v)
        out[1] += 1
        return out

    report = _gate(off_by_one, make_op("t_isum_big", _isum), x)
    assert not report.passed
    assert f"got {2**60 + 1}, reference {2**60} (off by +1)" in report.reason


def test_uint64_outputs_are_compared_exactly() -> None:
    x = np.full((2, 4), 2**62, np.uint64)

    def usum(v: np.ndarray) -> np.ndarray:
        return v.sum(-1, dtype=np.uint64)

    assert _gate(usum, make_op("t_usum", usum), x).passed
    report = _gate(lambda v: usum(v) - np.uint64(1), make_op("t_usum2", usum), x)
    assert not report.passed
    assert f"got {2**64 - 1}, reference 0 (off by +{2**64 - 1})" in report.reason


def test_a_boolean_mismatch_prints_booleans() -> None:
    report = _gate(lambda x: x <= 0, make_op("t_positive", lambda x: x > 0), X)
    assert not report.passed
    assert "got False, reference True (integer and boolean" in report.reason


# -- 3 and 4: what a failing input was ----------------------------------------------------

def _scaled(x: np.ndarray, a: Any, k: Any) -> np.ndarray:
    return (x.astype(np.float64) * float(a)).sum(-1) + int(k)


def test_numbers_among_the_inputs_are_described_by_their_values() -> None:
    """Before: ``4x64, , `` (an empty field per number)."""
    wrong = lambda x, a, k: (_scaled(x, a, k) + 1.0).astype(x.dtype)  # noqa: E731
    report = _gate(wrong, make_op("t_scaled", _scaled), X, 2.0, 3)
    assert not report.passed and report.failing is not None
    assert report.failing.shapes == "6x40, 2.0, int 3"
    assert all(part.strip() for t in report.trials for part in t.shapes.split(","))
    numpy_scalars = _gate(wrong, make_op("t_scaled2", _scaled), X, np.float32(0.5),
                          np.array(4))
    # the gate's trials hold a NumPy scalar as the 0-d array it converts to
    assert numpy_scalars.trials[0].shapes == "6x40, 0-d float32 0.5, 0-d int64 4"


def _sum(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64).sum(-1)


def _wrong_unless_c_order(x: np.ndarray) -> np.ndarray:
    out = _sum(x) * (1.0 if x.flags.c_contiguous else 1.01)
    return out.astype(x.dtype)


@pytest.mark.parametrize(("make", "text"), [
    (lambda: np.asfortranarray(X), "6x40 F-order"),
    (lambda: np.ascontiguousarray(X.T).T, "6x40 F-order"),
    (lambda: np.repeat(X, 2, axis=1)[:, ::2], "6x40 strided (with gaps)"),
    (lambda: X[::-1], "6x40 strided (reversed)"),
    (lambda: np.broadcast_to(X[:1], (6, 40)), "6x40 strided (broadcast)"),
], ids=["fortran", "transposed", "gapped", "reversed", "broadcast"])
def test_a_layout_other_than_c_order_is_named(make: Callable[[], np.ndarray],
                                              text: str) -> None:
    """Before: ``(the dispatch's own inputs: 6x40)``, whatever the layout."""
    x = make()
    report = _gate(_wrong_unless_c_order, make_op("t_sum_layout", _sum), x)
    assert not report.passed and report.failing is not None
    assert report.failing.index == 0 and report.failing.shapes == text
    assert f"shapes {text}: " in report.summary()
    assert _gate(_wrong_unless_c_order, make_op("t_sum_c", _sum), X).trials[0].shapes == "6x40"


def test_integer_outputs_beside_floating_ones_are_a_clear_error() -> None:
    """An argmax and a max from one reference cannot be judged as one stacked array
    (exact and rounded): the gate says so and names the op, rather than rejecting a
    correct kernel for an output dtype (float64) it never returned."""

    def ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.argmax(x, axis=-1), x.astype(np.float64).max(axis=-1)

    op = make_op("qa_argmax_max", ref)
    with pytest.raises(ValueError, match=r"qa_argmax_max.*int64, float64.*op per output"):
        _gate(lambda x: (np.argmax(x, axis=-1), x.max(axis=-1)), op, X)
