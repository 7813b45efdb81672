"""bench/gate_power.py in its reduced (CI) form: on a few small shapes, the F4 gate rejects
no correct variant over a 3-seed sweep and catches at least 95% of the mutants that change
the output, beside the two tolerance checks."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.factories import ROOT

SCRIPT = ROOT / "bench" / "gate_power.py"

# the project's CI runs the host-free tests (.ci/run): the reduced benchmark is one
pytestmark = pytest.mark.host_free


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("gate_power", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gate_power"] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("gate_power", None)


def test_the_catalogue_has_what_the_issue_asks(bench: ModuleType) -> None:
    mutants = {(v.op, v.name) for v in bench.VARIANTS if not v.correct}
    correct = [v for v in bench.VARIANTS if v.correct]
    assert len(mutants) >= 15
    assert {op for op, _ in mutants} == {"matmul", "softmax", bench.USER_OP}
    assert {v.op for v in correct} == {"matmul", "softmax", bench.USER_OP}
    assert {"sequential", "pairwise", "blocked-64", "split-K-4", "kahan", "online",
            "log-sum-exp"} <= {v.name for v in correct}
    assert any(k % 128 for op, shapes in bench.QUICK_SHAPES.items() if op == "matmul"
               for k in (s[2] for s in shapes))  # a ragged K


@pytest.mark.slow
def test_reduced_benchmark_catches_mutants_and_rejects_no_correct_kernel(
        bench: ModuleType) -> None:
    tally = bench.run_power(bench.QUICK_SHAPES)
    assert not tally.false_reject_notes, tally.false_reject_notes
    assert sum(tally.false_rejects[("F4", d)] for d in bench.DTYPES) == 0
    live = sum(tally.live.values())
    caught = sum(tally.caught[("F4", d)] for d in bench.DTYPES)
    assert live >= 100 and caught >= 0.95 * live, tally.misses
    # the tolerance checks were measured too, and the table prints
    assert sum(tally.false_rejects[("np.allclose", d)] for d in bench.DTYPES) > 0
    text = "\n".join(bench.format_power(tally))
    assert "F4" in text and "np.allclose" in text and "torch" in text


@pytest.mark.slow
def test_reduced_false_alarm_sweep_is_clean(bench: ModuleType) -> None:
    sweep = bench.run_sweep(bench.QUICK_SHAPES, 3)
    assert sweep.calls >= 300
    assert not sweep.rejects, sweep.rejects
    assert sweep.worst_ratio <= 1.0 and sweep.worst_bias < 1.0 and sweep.worst_spread < 1.0


def test_rounding_helpers(bench: ModuleType) -> None:
    import numpy as np

    from pytest_arbiter.core.dtypes import numpy_dtype, round_to, spacing

    bf16 = numpy_dtype("bfloat16")
    values = np.random.default_rng(5).standard_normal(1000) * 3.0
    nearest = round_to(values, "bfloat16")
    ulp = spacing(values, "bfloat16")
    trunc = bench.round_directed(values, bf16, "trunc").astype(np.float64)
    floor = bench.round_directed(values, bf16, "floor").astype(np.float64)
    assert np.all(np.abs(trunc) <= np.abs(values)) and np.all(np.abs(trunc - values) < ulp)
    assert np.all(floor <= values) and np.all(values - floor < ulp)
    assert np.any(trunc != nearest) and np.any(floor != nearest)
    x = np.array([1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -12], np.float32)
    assert list(bench.round_tf32(x).astype(np.float64)) == [1.0, 1.0 + 2.0 ** -9, 1.0]


def test_the_user_op_study_has_what_the_issue_asks(bench: ModuleType) -> None:
    assert len(bench.USER_OPS) >= 5
    for spec in bench.USER_OPS:
        variants = [v for v in bench.USER_VARIANTS if v.op == spec.name]
        assert sum(v.correct for v in variants) >= 3, spec.name
        assert sum(not v.correct for v in variants) >= 3, spec.name
        assert {v.base for v in variants if not v.correct} <= {
            v.name for v in variants if v.correct}, spec.name


def test_user_ops_gated_without_and_with_gate_inputs(bench: ModuleType) -> None:
    """One seed of three user ops through the public API: the derived trials alone catch
    a logsumexp without its max shift or with a global max; the GEMM expansion of
    distances (near points) and a scan's carry bug past 2048 elements need the op's
    gate_inputs; no correct kernel is rejected."""
    tally = bench.run_user_power(quick=True, seeds=1,
                                 names=("bench_logsumexp", "bench_pdist", "bench_cumsum"))
    assert not tally.false_reject_notes, tally.false_reject_notes
    kinds = tally.by_kind  # (op, mutant): [changing runs, F4, F4+gate_inputs, allclose, torch]
    for name in ("no-max", "global-max"):
        runs, f4, f4_gi, *_ = kinds[("bench_logsumexp", name)]
        assert runs == 3 and f4 == runs and f4_gi == runs
    runs, f4, f4_gi, *_ = kinds[("bench_pdist", "gemm")]
    assert f4 == 0 and f4_gi >= 2  # float32 and float16; bfloat16's products are exact
    runs, f4, f4_gi, *_ = kinds[("bench_cumsum", "carry-2048")]
    assert runs == 3 and f4 == 0 and f4_gi == runs
    text = "\n".join(bench.format_user_power(tally))
    assert "F4+gate_inputs" in text and "np.allclose" in text and "torch" in text
