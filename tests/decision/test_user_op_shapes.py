"""A user op's gate verdict holds for the shapes it was checked on: its derived trials
keep the dispatch's shapes, so a kernel wrong for some lengths only (an unrolled loop's
tail) is gated again on each length a key is given, and never serves one it fails."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pytest_arbiter import Arbiter, MeasureCache
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.ops import OpRegistry, make_op


def scan(x: Any) -> Any:
    """Right, and several times slower than ``unrolled``: the pick of a tune."""
    for _ in range(8):
        out = np.cumsum(x.astype(np.float64), axis=-1).astype(x.dtype)
    return out


def unrolled(x: Any) -> Any:
    """Right but when ``n % 8 == 7``: the tail loop of an unroll by 8 skips the last."""
    out = np.cumsum(x, axis=-1)
    if x.shape[-1] % 8 == 7:
        out[..., -1] = out[..., -2]
    return out


@pytest.mark.parametrize("mode", ["static", "tune"])
def test_a_kernel_wrong_for_one_length_never_serves_it(mode: str) -> None:
    ops = OpRegistry()
    ops.register(make_op("qa_scan", lambda x: np.cumsum(np.asarray(x, np.float64), axis=-1)))
    reg = CandidateRegistry()
    reg.extend([FunctionCandidate(unrolled, "unrolled", "qa_scan", "cpu", 5, None, None),
                FunctionCandidate(scan, "scan", "qa_scan", "cpu", 0, None, None)])
    arb = Arbiter(registry=reg, ops=ops, cache=MeasureCache(), mode=mode)
    rng = np.random.default_rng(0)
    for n in (1001, 1023, 1001):  # one key: 1024 wide, alignment 1
        x = rng.standard_normal((4, n)).astype(np.float32)
        out = arb.dispatch("qa_scan", x)
        np.testing.assert_allclose(out, np.cumsum(x.astype(np.float64), axis=-1),
                                   rtol=1e-4, atol=1e-4)
    counts = arb.histogram.counts()
    # caught at 1023; a rejection holds for the whole key: 1001 is not served by it again
    assert counts[("cpu", "qa_scan", "unrolled", "rejected")] == 2, counts
    assert ("cpu", "qa_scan", "scan", "won") in counts, counts


def test_with_the_gate_off_a_user_op_is_gated_once_per_key_and_layout() -> None:
    """Production with no corpus entry: what is not vouched for is gated at a key's
    first dispatch, not at every new length a workload brings."""
    from pytest_arbiter.decision.gating import gated_as

    user = make_op("qa_user2", lambda x: x * 2)
    a, b = np.ones((4, 1001), np.float32), np.ones((4, 1023), np.float32)
    assert gated_as(user, (a,), per_shape=False) == gated_as(user, (b,), per_shape=False)
    ops = OpRegistry()
    ops.register(user)
    reg = CandidateRegistry()
    reg.extend([FunctionCandidate(lambda x: x * 2, "twice", "qa_user2", "cpu", 0, None, None)])
    arb = Arbiter(registry=reg, ops=ops, cache=MeasureCache(), mode="static", gate=False)
    for n in (1001, 1009, 1023):
        arb.dispatch("qa_user2", np.ones((4, n), np.float32))
    assert len(arb.gates._held) == 1


def test_a_built_in_op_is_gated_once_per_key_and_layout() -> None:
    """Its generated trials hold the key's ragged tails: a pass holds for the key."""
    from pytest_arbiter.core.ops import OPS
    from pytest_arbiter.decision.gating import gated_as

    a, b = np.ones((24, 16), np.float32), np.ones((16, 8), np.float32)
    c = np.ones((20, 16), np.float32)
    matmul = OPS.get("matmul")
    assert gated_as(matmul, (a, b)) == gated_as(matmul, (c, b)) == ("C", "C")
    user = make_op("qa_user", lambda x, y: x @ y)
    assert gated_as(user, (a, b)) != gated_as(user, (c, b))


def test_several_outputs_come_back_as_a_tuple_on_every_path() -> None:
    """A mean and a variance per row: a candidate returns a tuple, and so does the
    reference when it serves (the candidate declined the odd row count)."""
    ops = OpRegistry()
    ops.register(make_op("qa_moments", lambda x: (np.asarray(x, np.float64).mean(-1),
                                                   np.asarray(x, np.float64).var(-1))))
    reg = CandidateRegistry()
    reg.extend([FunctionCandidate(lambda x: (x.mean(-1), x.var(-1)), "moments", "qa_moments",
                                  "cpu", 0, lambda x: x.shape[0] % 2 == 0, None)])
    arb = Arbiter(registry=reg, ops=ops, cache=MeasureCache(), mode="static")
    x = np.random.default_rng(0).standard_normal((8, 100)).astype(np.float32)
    for rows in (8, 7):
        out = arb.dispatch("qa_moments", x[:rows])
        assert isinstance(out, tuple) and len(out) == 2
        assert all(part.shape == (rows,) and part.dtype == np.float32 for part in out)
    ops.register(make_op("qa_ragged", lambda x: (x.sum(), x.sum(-1))))
    reg.extend([FunctionCandidate(lambda x: (x.sum(), x.sum(-1)), "ragged", "qa_ragged",
                                  "cpu", 0, None, None)])
    with pytest.raises(ValueError, match=r"op 'qa_ragged': its reference returns 2 outputs "
                                         r"of shapes \(\), \(8,\)"):
        arb.dispatch("qa_ragged", x[:8])


class DeviceArray:
    """A device array as the gate meets one: ``get()`` copies it to the host."""

    def __init__(self, values: Any) -> None:
        self.values = values

    def get(self) -> Any:
        return self.values


def test_a_device_candidate_s_several_outputs_are_copied_back_each() -> None:
    from pytest_arbiter.decision.gating import f4_gate

    op = make_op("qa_moments2", lambda x: (np.asarray(x, np.float64).mean(-1),
                                           np.asarray(x, np.float64).var(-1)))
    cand = FunctionCandidate(lambda x: (DeviceArray(x.mean(-1)), DeviceArray(x.var(-1))),
                             "device_moments", "qa_moments2", "cpu", 0, None, None)
    x = np.random.default_rng(1).standard_normal((8, 64))
    report = f4_gate(cand, op, inputs=(x,))
    assert report.passed, report.summary()
