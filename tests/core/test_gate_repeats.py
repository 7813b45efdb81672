"""Trial 7's racy kernel: a user op's candidate wrong on every 7th call passed the F4 gate
(which called it 5 times) and served 3 wrong results in 20 as ``won``. The gate now runs
a candidate that passed its trials REPEATS more times on the first of them, after the
rest, and rejects it as ``nondeterministic`` when a later output is wrong where the first
was right (docs/accuracy.md, "Repeated calls"). Each test but the last two fails on the
gate before it; those two guard the rule's other side: a correct kernel whose last bits
vary between calls (atomics, a thread pool's order) still passes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pytest_arbiter import Arbiter, HistogramKey, MatmulRegion, MeasureCache, f4_gate
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.gate import REPEATS, GateReport
from pytest_arbiter.core.ops import OPS, Op, OpRegistry, make_op

X = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
NONDETERMINISTIC = "returned different results for the same input on calls 1 and "


def _cumsum_ref(x: np.ndarray) -> np.ndarray:
    return np.cumsum(x.astype(np.float64), axis=-1)


CUMSUM = make_op("t_racy_cumsum", _cumsum_ref)


def _argmax_ref(x: np.ndarray) -> np.ndarray:
    return np.argmax(x, axis=-1)


ARGMAX = make_op("t_racy_argmax", _argmax_ref)


def _gate(kernel: Callable[..., Any], op: Op, *inputs: Any, **kwargs: Any) -> GateReport:
    cand = FunctionCandidate(kernel, "kernel", op.name, "cpu", 0, None, None)
    return f4_gate(cand, op, inputs=inputs or None, **kwargs)


def _trials(op: Op, *inputs: Any, **kwargs: Any) -> int:
    """How many trials the gate runs before its repeats (a correct kernel's report)."""
    def correct(*a: Any) -> np.ndarray:
        ref = np.asarray(op.reference(*a))
        return ref.astype(a[0].dtype) if ref.dtype.kind == "f" else ref

    report = _gate(correct, op, *inputs, **kwargs)
    assert report.passed, report.summary()
    return len(report.trials)


class Racy:
    """Trial 7's ``racy`` cumsum: every ``every``-th call loses a block carry."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.calls = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        y = np.cumsum(x, axis=-1)
        if self.calls % self.every == 0:
            y[..., 4:] -= y[..., 3:4]
        return y


def _assert_nondeterministic(report: GateReport) -> None:
    assert not report.passed and report.rejected, report.summary()
    failing = report.failing
    assert failing is not None and failing.status == "fail"
    assert failing.failure == "nondeterministic"
    assert report.reason.startswith(NONDETERMINISTIC), report.reason
    assert "max difference" in report.reason


@pytest.mark.parametrize("past", range(1, REPEATS + 1))
def test_a_kernel_wrong_on_a_call_past_the_trials_is_rejected(past: int) -> None:
    """Wrong on the first call after the trials, or the second: the old gate made none."""
    every = _trials(CUMSUM, X) + past
    report = _gate(Racy(every), CUMSUM, X)
    _assert_nondeterministic(report)
    assert report.reason.startswith(f"{NONDETERMINISTIC}{past + 1}: "), report.reason


def test_trial_7s_racy_kernel_is_passed_over_and_never_serves_a_wrong_result() -> None:
    ops = OpRegistry()
    ops.register(make_op("t_r7_cumsum", _cumsum_ref))
    reg = CandidateRegistry()
    reg.extend([FunctionCandidate(Racy(7), "racy", "t_r7_cumsum", "cpu", 9, None, None),
                FunctionCandidate(lambda x: np.cumsum(x, axis=-1), "plain", "t_r7_cumsum",
                                  "cpu", 1, None, None)])
    arb = Arbiter(registry=reg, ops=ops, cache=MeasureCache(), mode="static")
    for _ in range(20):
        np.testing.assert_allclose(arb.dispatch("t_r7_cumsum", X), _cumsum_ref(X), atol=1e-4)
    counts = arb.histogram.counts()
    assert counts[HistogramKey("cpu", "t_r7_cumsum", "plain", "won")] == 20
    assert HistogramKey("cpu", "t_r7_cumsum", "racy", "won") not in counts
    assert NONDETERMINISTIC in arb.reasons[("cpu", "t_r7_cumsum", "racy", "rejected")]


class StaleWorkspace:
    """An uninitialised, reused buffer: the kernel keeps one workspace per shape, made by
    ``np.empty`` and never cleared, and on every ``every``-th call its last row's worker
    does not write (a thread pool's race): the row keeps what the last call left there."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.calls = 0
        self.spaces: dict[tuple[int, ...], np.ndarray] = {}

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        space = self.spaces.setdefault(x.shape, np.empty(x.shape, x.dtype))
        rows = x.shape[0] - (self.calls % self.every == 0)
        np.cumsum(x[:rows], axis=-1, out=space[:rows])
        return space.copy()


def test_a_kernel_returning_a_stale_uninitialised_buffer_is_rejected() -> None:
    """The repeats run after the other trials: the workspace holds another input's result
    then, not the one the repeated input would leave (which would look right)."""
    report = _gate(StaleWorkspace(_trials(CUMSUM, X) + 1), CUMSUM, X)
    _assert_nondeterministic(report)


def test_a_builtin_op_gated_on_a_region_repeats_its_smallest_trial() -> None:
    """Here the region's own shape; the ragged and special trials are larger."""
    region = MatmulRegion.of(24, 16, 40, "float32")
    every = _trials(OPS.get("matmul"), region=region) + 1
    calls: list[tuple[int, ...]] = []

    def racy_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        calls.append(a.shape)
        out = np.matmul(a, b)
        if len(calls) % every == 0:
            out[-1, -1] += 1.5
        return out

    report = _gate(racy_matmul, OPS.get("matmul"), region=region)
    _assert_nondeterministic(report)
    assert "max difference 1.5 in 1 of 384 outputs" in report.reason
    assert calls[-1] == calls[0] == (24, 40)


def test_an_integer_output_that_changes_between_calls_is_rejected() -> None:
    """Ties broken one way, then the other (a parallel reduction's order): integer outputs
    are compared exactly, so the last index on a repeated call fails."""
    x = np.zeros((4, 16), np.float32)
    x[:, 3] = x[:, 9] = 1.0
    every = _trials(ARGMAX, x) + 1
    calls = {"n": 0}

    def argmax(v: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        if calls["n"] % every == 0:
            return v.shape[-1] - 1 - np.argmax(v[..., ::-1], axis=-1)
        return np.argmax(v, axis=-1)

    report = _gate(argmax, ARGMAX, x)
    _assert_nondeterministic(report)
    assert "max difference 6 in 4 of 4 outputs" in report.reason


def test_inputs_written_to_on_a_repeated_call_are_caught() -> None:
    every = _trials(CUMSUM, X) + 1
    calls = {"n": 0}

    def scribbler(x: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        y = np.cumsum(x, axis=-1)
        if calls["n"] % every == 0:
            x[0, 0] = 0.0
        return y

    report = _gate(scribbler, CUMSUM, X)
    assert not report.passed and report.failing is not None
    assert report.failing.failure == "inputs_modified"
    assert report.reason.startswith("the kernel modified its inputs (call 2 on the same")


def test_a_passing_kernel_runs_repeats_more_times_on_the_dispatchs_inputs() -> None:
    seen: list[np.ndarray] = []

    def plain(x: np.ndarray) -> np.ndarray:
        seen.append(x.copy())
        return np.cumsum(x, axis=-1)

    report = _gate(plain, CUMSUM, X)
    assert report.passed and len(seen) == len(report.trials) + REPEATS
    assert all(np.array_equal(x, X) for x in (seen[0], *seen[-REPEATS:]))
    # a rejected kernel is not repeated: its verdict is known
    seen.clear()
    wrong = _gate(lambda x: plain(x) * 2, CUMSUM, X)
    assert not wrong.passed and len(seen) == len(wrong.trials)


def test_a_float_kernel_whose_last_bits_vary_between_calls_passes() -> None:
    """Floating-point outputs are held to the budget on every call, not to the first
    call's bits: a scan whose block order changes between calls passes."""
    calls = {"n": 0}

    def blocked(x: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        if calls["n"] % 2:
            return np.cumsum(x, axis=-1)
        y = np.cumsum(x.reshape(*x.shape[:-1], -1, 8), axis=-1)
        carry = np.cumsum(y[..., -1], axis=-1) - y[..., -1]
        return (y + carry[..., None]).reshape(x.shape)

    assert not np.array_equal(blocked(X), blocked(X))
    report = _gate(blocked, CUMSUM, X)
    assert report.passed, report.summary()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_matmul_whose_summation_order_varies_between_calls_passes(dtype: str) -> None:
    """Split-K on some calls, one pass on others (atomics): in the 16-bit types too, where
    two correct results may lie an ulp apart."""
    from pytest_arbiter.core.dtypes import round_to

    calls = {"n": 0}

    def split_k(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        if calls["n"] % 2:
            out = a32 @ b32
        else:
            half = a.shape[1] // 2
            out = a32[:, :half] @ b32[:half] + a32[:, half:] @ b32[half:]
        return round_to(out.astype(np.float64), dtype).astype(a.dtype)

    report = _gate(split_k, OPS.get("matmul"), region=MatmulRegion.of(24, 16, 200, dtype))
    assert report.passed, report.summary()
