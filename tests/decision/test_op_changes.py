"""A gate verdict is made against the op's definition as well as the candidate's code:
a user op's fixed reference has the candidates it failed gated again (the next tune
times them; a plain run stops replaying the old verdict), while the timings stand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_arbiter import Arbiter, ComparePolicy, MeasureCache
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.ops import OpRegistry, make_op
from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.extend.fingerprint import fingerprint_of

scipy_linalg = pytest.importorskip("scipy.linalg")

POLICY = ComparePolicy(min_rounds=7, max_rounds=30, budget_s=0.005)
ERROR = ("cpu", "qa_spd", "cho", "error")


def solve(a: Any, b: Any) -> Any:
    return np.linalg.solve(a, b)


def cho(a: Any, b: Any) -> Any:
    """Cholesky: right for a symmetric positive definite matrix, raises on others."""
    return scipy_linalg.cho_solve(scipy_linalg.cho_factor(a), b)


def lax(a: Any, b: Any) -> Any:
    """Solves any matrix: the gate's trials of random matrices count against cho."""
    return np.linalg.solve(np.asarray(a, np.float64), np.asarray(b, np.float64))


def strict(a: Any, b: Any) -> Any:
    """Raises on a matrix that is not positive definite: such a trial is skipped."""
    np.linalg.cholesky(np.asarray(a, np.float64))
    return lax(a, b)


def arbiter(reference: Callable[..., Any], cache: MeasureCache, mode: str) -> Arbiter:
    ops = OpRegistry()
    ops.register(make_op("qa_spd", reference))
    reg = CandidateRegistry()
    reg.extend([FunctionCandidate(solve, "solve", "qa_spd", "cpu", 1, None, None),
                FunctionCandidate(cho, "cho", "qa_spd", "cpu", 0, None, None)])
    return Arbiter(registry=reg, ops=ops, cache=cache, mode=mode, policy=POLICY)


def spd_inputs() -> tuple[np.ndarray, np.ndarray]:
    m = np.random.default_rng(0).standard_normal((48, 48))
    return m @ m.T + 48 * np.eye(48), np.ones((48, 4))


def test_a_fixed_reference_has_the_candidate_it_failed_gated_again() -> None:
    cache, inputs = MeasureCache(), spd_inputs()
    arbiter(lax, cache, "tune").dispatch("qa_spd", *inputs)
    (entry,) = cache.entries()
    assert entry.considered["cho"].outcome == "error", entry.considered
    assert [r.name for r in entry.ranking] == ["solve"]
    replay = arbiter(lax, cache, "static")
    replay.dispatch("qa_spd", *inputs)
    assert replay.histogram.counts()[ERROR] == 1  # the corpus's verdict, replayed
    fixed = arbiter(strict, cache, "static")
    fixed.dispatch("qa_spd", *inputs)
    assert ERROR not in fixed.histogram.counts()  # made against the old reference
    arbiter(strict, cache, "tune").dispatch("qa_spd", *inputs)
    (entry,) = cache.entries()
    assert entry.considered["cho"].outcome == "timed", entry.considered
    assert sorted(r.name for r in entry.ranking) == ["cho", "solve"]


def test_a_verdict_row_records_the_op_definition_a_timed_row_does_not() -> None:
    from pytest_arbiter.extend.fingerprint import op_fingerprint

    cache, inputs = MeasureCache(), spd_inputs()
    tuner = arbiter(lax, cache, "tune")
    tuner.dispatch("qa_spd", *inputs)
    (entry,) = cache.entries()
    by_name = {c.name: c for c in tuner.registry.for_op("qa_spd")}
    op = tuner.ops.get("qa_spd")
    assert op_fingerprint(op) == op_fingerprint(op) and op_fingerprint(op) is not None
    timed, failed = entry.considered["solve"], entry.considered["cho"]
    assert timed.fingerprint == fingerprint_of(by_name["solve"]) and not timed.op_fingerprint
    assert failed.fingerprint == fingerprint_of(by_name["cho"])
    assert failed.op_fingerprint == op_fingerprint(op)
    assert op_fingerprint(make_op("qa_spd", strict)) != op_fingerprint(op)
    assert op_fingerprint(tuner.ops.get("matmul")) is None  # the package's definition


def test_the_op_fingerprint_survives_the_file_and_a_forged_one_is_refused(
        tmp_path: Path) -> None:
    from pytest_arbiter.store import artifacts

    cache, inputs = MeasureCache(), spd_inputs()
    arbiter(lax, cache, "tune").dispatch("qa_spd", *inputs)
    path = tmp_path / "c.json"
    artifacts.write_cache(path, cache)
    (entry,) = artifacts.read_cache(path).entries()
    (before,) = cache.entries()
    assert entry.considered["cho"] == before.considered["cho"]
    assert len(entry.considered["cho"].op_fingerprint) == 16
    text = path.read_text()
    forged = text.replace(before.considered["cho"].op_fingerprint, "not-a-hash")
    assert forged != text
    path.write_text(forged)
    with pytest.raises(ArtifactError, match=r"c\.json.*op_fingerprint"):
        artifacts.read_cache(path)


def test_a_gate_verdict_names_the_input_it_failed_on_and_how_to_skip_it() -> None:
    """The corpus's reason says which trial raised (a derived one, with its seed) and
    how to keep inputs outside the op's domain out of the gate; a failure on the
    dispatch's own inputs has no seed to print."""
    cache, inputs = MeasureCache(), spd_inputs()
    arbiter(lax, cache, "tune").dispatch("qa_spd", *inputs)
    (entry,) = cache.entries()
    why = entry.considered["cho"].reason
    assert "on input #1 (fresh values of the dispatch's shapes: 48x48, 48x4, seed " in why
    assert "raised LinAlgError" in why and "make its reference (or validate) raise" in why
    from pytest_arbiter.core.candidates import FunctionCandidate as Fn
    from pytest_arbiter.decision.gating import f4_gate, verdict_of

    off = Fn(lambda a, b: solve(a, b) * 1.01, "off", "qa_spd", "cpu", 0, None, None)
    reason = verdict_of(f4_gate(off, make_op("qa_spd", lax), inputs=inputs)).reason
    assert reason.endswith("(on input #0 (the dispatch's own inputs: 48x48, 48x4))")
    assert "seed" not in reason


def test_an_ill_conditioned_own_input_says_a_budget_may_be_needed() -> None:
    """A float32 Cholesky solve of a system of condition 1e4 loses what any backward
    stable float32 solver loses there: rejected on the dispatch's own inputs (precision
    is judged there), with a word that the reference's sensitivity explains it; a kernel
    wrong by 1% gets no such word."""
    from pytest_arbiter.decision.gating import f4_gate

    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((32, 32)))
    a = ((q * np.logspace(0, -4, 32)) @ q.T).astype(np.float32)
    a = (a + a.T) / 2
    b = rng.standard_normal(32).astype(np.float32)
    op = make_op("qa_spd_cond", strict)
    hint = "within what the reference's sensitivity on these inputs lets a correct kernel"
    right = f4_gate(FunctionCandidate(cho, "cho", "qa_spd_cond", "cpu", 0, None, None), op,
                    inputs=(a, b))
    assert not right.passed and hint in right.summary(), right.summary()
    off = FunctionCandidate(lambda x, y: solve(x, y) * 1.01, "off", "qa_spd_cond", "cpu", 0,
                            None, None)
    wrong = f4_gate(off, op, inputs=(a, b))
    assert not wrong.passed and hint not in wrong.summary()


# -- a definition replaced in the same process --------------------------------------------


def _tf32(x: np.ndarray) -> np.ndarray:
    return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def tf32_gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.matmul(_tf32(a), _tf32(b))
    return out


def test_taking_tf32_back_gates_the_kernel_again_in_a_live_arbiter() -> None:
    """allow_tf32(allow=False) holds "in every gate of this process": an arbiter that
    planned (and gated) the key while TF32 was allowed gates the kernel again, and
    rejects it, instead of serving it on the verdict it held."""
    from pytest_arbiter.core.ops.registry import allow_tf32

    registry = CandidateRegistry()
    registry.extend([FunctionCandidate(tf32_gemm, "tf32_gemm", "matmul", "cpu", 1, None,
                                       None)])
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2))
    allow_tf32("matmul", "float32", allow=True)
    try:
        arb = Arbiter(registry=registry, mode="static")
        arb.dispatch("matmul", a, b)
        assert arb.histogram.counts() == {("cpu", "matmul", "tf32_gemm", "won"): 1}
    finally:
        allow_tf32("matmul", "float32", allow=False)
    arb.dispatch("matmul", a, b)
    assert arb.histogram.counts()[("cpu", "matmul", "tf32_gemm", "rejected")] == 1


def test_a_user_op_re_registered_with_a_tighter_budget_gates_again() -> None:
    """The same reference with a new ``budget=`` replaces the op: the verdict a live
    arbiter held under the old budget is not reused."""
    ops = OpRegistry()

    def twice(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = x * 2.0
        return out

    def rough(x: np.ndarray) -> np.ndarray:  # off by a relative 1e-9
        out: np.ndarray = x * (2.0 + 2e-9)
        return out

    def loose(inputs: Any, exact: np.ndarray) -> np.ndarray:
        out: np.ndarray = 1e-6 * np.abs(exact)
        return out

    def tight(inputs: Any, exact: np.ndarray) -> np.ndarray:
        out: np.ndarray = 1e-12 * np.abs(exact)
        return out

    ops.register(make_op("qa_twice", twice, budget=loose))
    registry = CandidateRegistry()
    registry.extend([FunctionCandidate(rough, "rough", "qa_twice", "cpu", 0, None, None)])
    arb = Arbiter(registry=registry, ops=ops, mode="static")
    x = np.random.default_rng(1).standard_normal(256)
    arb.dispatch("qa_twice", x)
    assert arb.histogram.counts() == {("cpu", "qa_twice", "rough", "won"): 1}
    ops.register(make_op("qa_twice", twice, budget=tight))
    arb.dispatch("qa_twice", x)
    assert arb.histogram.counts()[("cpu", "qa_twice", "rough", "rejected")] == 1


def test_registering_the_same_op_again_keeps_the_verdicts() -> None:
    """``op()`` called again with the same definition (in a fixture, per test) changes
    nothing: a live arbiter does not gate its candidates again."""
    import pytest_arbiter.decision.gating as gating

    ops = OpRegistry()

    def twice(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = x * 2.0
        return out

    ops.register(make_op("qa_again", twice))
    registry = CandidateRegistry()
    registry.extend([FunctionCandidate(lambda x: x + x, "k", "qa_again", "cpu", 0, None,
                                       None)])
    arb = Arbiter(registry=registry, ops=ops, mode="static")
    calls = {"n": 0}
    real = gating.f4_gate

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        return real(*args, **kwargs)

    gating.f4_gate = counting
    try:
        for _ in range(3):
            ops.register(make_op("qa_again", twice))
            arb.dispatch("qa_again", np.arange(64.0))
    finally:
        gating.f4_gate = real
    assert calls["n"] == 1 and ops.generation == 0


def test_an_op_defined_in_a_fixture_registers_again_for_each_test() -> None:
    """A fixture makes its reference anew for each test: the same code, so the same
    op (no error, nothing to gate again); the same code closing over another value is
    another reference, refused."""

    def made(scale: float) -> Callable[[np.ndarray], np.ndarray]:
        def ref(x: np.ndarray) -> np.ndarray:
            out: np.ndarray = x.astype(np.float64) * scale
            return out
        return ref

    ops = OpRegistry()
    three = 3.0
    ops.register(make_op("qa_fixture", made(three)))
    ops.register(make_op("qa_fixture", made(three)))
    assert ops.generation == 0
    with pytest.raises(ValueError, match="cannot be re-registered"):
        ops.register(make_op("qa_fixture", made(4.0)))
