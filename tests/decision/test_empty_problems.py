"""A dispatch of an empty problem returns NumPy's result and records it like any other:
in both modes, gate on or off, through an arbiter of one's own, the run's arbiter
(``pytest_arbiter.dispatch`` here and in a pytester run) and production's (a
subprocess, ``PYTEST_ARBITER_GATE`` unset and set). docs/contract.md, "Empty inputs"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pytest_arbiter
from pytest_arbiter import Arbiter

pytest_plugins = ["pytester"]

PROBLEMS: list[tuple[str, tuple[tuple[int, ...], ...]]] = [
    ("matmul", ((0, 16), (16, 8))),  # M = 0
    ("matmul", ((4, 16), (16, 0))),  # N = 0
    ("matmul", ((4, 0), (0, 8))),  # K = 0: M x N zeros
    ("softmax", ((0, 16),)),  # a zero leading axis
    ("softmax", ((2, 0, 16),)),  # a zero middle axis
]
DTYPES = ["float32", "float64"]
STATIC_PICK = {"matmul": "blas_matmul", "softmax": "inplace_softmax"}  # top of the tiers


def _problem_id(problem: tuple[str, tuple[tuple[int, ...], ...]]) -> str:
    op, shapes = problem
    return op + "-" + "-".join("x".join(map(str, s)) for s in shapes)


def _inputs(shapes: tuple[tuple[int, ...], ...], dtype: str) -> list[np.ndarray]:
    return [np.ones(s, dtype) for s in shapes]  # ones: a K = 0 result must still be zeros


def _numpy(op: str, inputs: list[np.ndarray]) -> np.ndarray:
    """What NumPy gives (softmax along the last axis written out in NumPy)."""
    if op == "matmul":
        out: np.ndarray = np.matmul(*inputs)
        return out
    (x,) = inputs
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    result: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return result


def _assert_numpy_result(op: str, inputs: list[np.ndarray], out: Any) -> None:
    want = _numpy(op, inputs)
    assert isinstance(out, np.ndarray)
    assert out.shape == want.shape and out.dtype == want.dtype == inputs[0].dtype
    assert np.array_equal(out, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("problem", PROBLEMS, ids=_problem_id)
@pytest.mark.parametrize(("mode", "gate"), [("static", False), ("static", True),
                                            ("tune", False), ("tune", True)])
def test_an_empty_problem_returns_numpys_result_and_records_won(
        mode: str, gate: bool, problem: tuple[str, tuple[tuple[int, ...], ...]],
        dtype: str) -> None:
    op, shapes = problem
    arb = Arbiter(mode=mode, gate=gate)
    inputs = _inputs(shapes, dtype)
    for _ in range(2):  # the plan made, then the plan reused
        _assert_numpy_result(op, inputs, arb.dispatch(op, *inputs))
    counts = arb.histogram.counts()
    assert len(counts) == 1, counts
    ((target, op_, selected, outcome), count), = counts.items()
    assert (target, op_, outcome, count) == ("cpu", op, "won", 2)
    if mode == "static":
        assert selected == STATIC_PICK[op]
    else:
        assert selected in {c.name for c in arb.registry.for_op(op, "cpu")}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("problem", PROBLEMS, ids=_problem_id)
def test_the_run_arbiter_serves_an_empty_problem(
        problem: tuple[str, tuple[tuple[int, ...], ...]], dtype: str) -> None:
    op, shapes = problem
    inputs = _inputs(shapes, dtype)
    before = pytest_arbiter.dispatch_histogram(op=op)
    _assert_numpy_result(op, inputs, pytest_arbiter.dispatch(op, *inputs))
    after = pytest_arbiter.dispatch_histogram(op=op)
    grown = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
    assert len(grown) == 1, grown
    ((_, _, _, outcome), count), = grown.items()
    assert (outcome, count) == ("won", 1)


def test_a_wrong_kernel_never_serves_an_empty_problem() -> None:
    from pytest_arbiter.core.candidates import FunctionCandidate
    from tests.factories import registry_of

    def one_row_too_many(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.zeros((a.shape[0] + 1, b.shape[1]), dtype=a.dtype)

    def library(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.matmul(a, b)
        return out

    reg = registry_of(FunctionCandidate(one_row_too_many, "one_row_too_many", "matmul",
                                        "cpu", 9, None, None),
                      FunctionCandidate(library, "library", "matmul", "cpu", 0, None, None))
    arb = Arbiter(registry=reg, mode="static", gate=False)
    inputs = _inputs(((0, 16), (16, 8)), "float32")
    _assert_numpy_result("matmul", inputs, arb.dispatch("matmul", *inputs))
    assert {(k.selected, k.outcome): n for k, n in arb.histogram.counts().items()} == {
        ("one_row_too_many", "rejected"): 1, ("library", "won"): 1}


PLUGIN_TESTS = '''
import numpy as np
import pytest
import pytest_arbiter

PROBLEMS = {problems!r}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("problem", PROBLEMS)
def test_empty(problem, dtype):
    op, shapes = problem
    inputs = [np.ones(s, dtype) for s in shapes]
    out = pytest_arbiter.dispatch(op, *inputs)
    if op == "matmul":
        want = np.matmul(*inputs)
    else:
        (x,) = inputs
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        want = e / e.sum(axis=-1, keepdims=True)
    assert out.shape == want.shape and out.dtype == want.dtype == inputs[0].dtype
    assert np.array_equal(out, want)
'''


@pytest.mark.usefixtures("clean_registry")
@pytest.mark.parametrize("tune", [False, True], ids=["static", "tune"])
def test_a_pytest_run_serves_empty_problems_and_counts_them_won(
        pytester: pytest.Pytester, tune: bool) -> None:
    pytester.makepyfile(test_empty=PLUGIN_TESTS.format(problems=PROBLEMS))
    args = ["--arbiter-histogram=h.json", "-p", "no:cacheprovider"]
    if tune:
        args += ["--arbiter-tune", "--arbiter-cache=cache.json"]
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=len(PROBLEMS) * len(DTYPES))
    assert result.ret == 0
    entries = json.loads((pytester.path / "h.json").read_text())["entries"]
    assert {e["outcome"] for e in entries} == {"won"}
    assert sum(e["count"] for e in entries) == len(PROBLEMS) * len(DTYPES)
    if not tune:
        assert {(e["op"], e["selected"]) for e in entries} == set(STATIC_PICK.items())


PRODUCTION = '''
import json
import numpy as np
import pytest_arbiter

for op, shapes in {problems!r}:
    for dtype in ("float32", "float64"):
        inputs = [np.ones(s, dtype) for s in shapes]
        out = pytest_arbiter.dispatch(op, *inputs)
        want = pytest_arbiter.OPS.get(op).reference(*inputs)
        assert out.shape == want.shape and out.dtype == want.dtype, (op, shapes, dtype)
        assert np.array_equal(out, want), (op, shapes, dtype)
print(json.dumps(sorted([*k, v] for k, v in pytest_arbiter.dispatch_histogram().items())))
'''


@pytest.mark.parametrize("gate", [None, "1"], ids=["gate-unset", "gate-on"])
def test_production_serves_empty_problems(tmp_path: Path, gate: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_ARBITER_")}
    if gate is not None:
        env["PYTEST_ARBITER_GATE"] = gate
    done = subprocess.run([sys.executable, "-c", PRODUCTION.format(problems=PROBLEMS)],
                          env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    counts = {"matmul": 3 * len(DTYPES), "softmax": 2 * len(DTYPES)}
    assert json.loads(done.stdout) == [["cpu", op, STATIC_PICK[op], "won", n]
                                       for op, n in counts.items()]
