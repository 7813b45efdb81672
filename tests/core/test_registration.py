"""Registration refuses mistakes; user ops' references may compute in any precision;
the gate tells a kernel that raised from one that returned a wrong result.

The new names are read through their modules inside each test, so every test here
fails on its own (not at import) against code without them.
"""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from pytest_arbiter.core import candidates, gate, ops
from pytest_arbiter.core.candidates import Candidate, CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.dtypes import bfloat16
from pytest_arbiter.decision.gating import f4_gate

# -- helpers ----------------------------------------------------------------------------


def _zeros(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.zeros((a.shape[0], b.shape[1]), a.dtype)


def _module(name: str, source: str) -> types.ModuleType:
    """Execute ``source`` as module ``name``, as an import (or a re-import) does."""
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


USER_KERNELS = """
import numpy as np

def blas_matmul(a, b):
    return np.matmul(a, b)

def scale(x):
    return x * 3
"""


class _SubclassKernel(Candidate):
    def run(self, *inputs: Any) -> Any:
        return np.matmul(*inputs)


class _OtherSubclassKernel(Candidate):
    def run(self, *inputs: Any) -> Any:
        return np.dot(*inputs)


@pytest.fixture
def empty() -> CandidateRegistry:
    return CandidateRegistry()


@pytest.fixture
def f32() -> Iterator[np.ndarray]:
    yield np.random.default_rng(7).standard_normal((6, 10)).astype(np.float32)


# -- targets ----------------------------------------------------------------------------


def test_unknown_target_is_refused_naming_the_known_ones(empty: CandidateRegistry) -> None:
    with pytest.raises(ValueError, match=r"unknown target 'nvida'.*amd, cpu, nvidia"):
        @candidates.candidate("matmul", target="nvida", registry=empty)
        def typo(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return a @ b
    # instances added directly are checked too, function candidates and subclasses alike
    with pytest.raises(ValueError, match=r"'nvida'.*known targets: amd, cpu, nvidia"):
        empty.add(FunctionCandidate(np.matmul, "direct", "matmul", "nvida", 0, None, None))
    with pytest.raises(ValueError, match="unknown target 'gpu'"):
        empty.add(_SubclassKernel("sub", "matmul", "gpu"))
    assert list(empty) == []


def test_register_target_lets_a_backend_add_its_own(empty: CandidateRegistry) -> None:
    with pytest.raises(ValueError, match="unknown target 'registration_npu'"):
        empty.add(FunctionCandidate(np.matmul, "npu_mm", "matmul", "registration_npu", 0,
                                    None, None))
    candidates.register_target("registration_npu")
    cand = FunctionCandidate(np.matmul, "npu_mm", "matmul", "registration_npu", 0, None, None)
    assert empty.add(cand) is cand and empty.get("npu_mm") is cand
    with pytest.raises(ValueError, match="registration_npu"):  # now listed as known
        empty.add(FunctionCandidate(np.matmul, "x", "matmul", "nope", 0, None, None))


# -- unique names -----------------------------------------------------------------------


def test_a_user_kernel_cannot_take_a_bundled_name(registry: CandidateRegistry) -> None:
    with pytest.raises(ValueError, match=r"'blas_matmul' is already registered \(op 'matmul', "
                       r"target 'cpu', defined by pytest_arbiter\.runtime\.cpu\.blas_matmul\)"):
        candidates.candidate("matmul", target="cpu", name="blas_matmul",
                             registry=registry)(_zeros)
    assert registry.get("blas_matmul").fn.__module__ == "pytest_arbiter.runtime.cpu"


def test_the_global_registry_refuses_it_before_its_first_read() -> None:
    # the bundled kernels load lazily: a user's module may register before anything reads
    code = ("import numpy as np, pytest_arbiter\n"
            "try:\n"
            "    @pytest_arbiter.candidate('matmul', target='cpu', name='blas_matmul')\n"
            "    def blas_matmul(a, b):\n"
            "        return np.zeros((a.shape[0], b.shape[1]), a.dtype)\n"
            "except ValueError as exc:\n"
            "    print('refused', 'pytest_arbiter.runtime.cpu.blas_matmul' in str(exc))\n"
            "print(pytest_arbiter.REGISTRY.get('blas_matmul').fn.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["refused", "True", "pytest_arbiter.runtime.cpu"]


def test_replace_true_overrides_a_taken_name(registry: CandidateRegistry) -> None:
    candidates.candidate("matmul", target="cpu", name="blas_matmul", registry=registry,
                         replace=True)(_zeros)
    assert registry.get("blas_matmul").fn is _zeros
    direct = FunctionCandidate(np.dot, "blas_matmul", "matmul", "cpu", 0, None, None)
    assert registry.add(direct, replace=True) is registry.get("blas_matmul")


def test_a_duplicate_from_other_code_names_the_first(empty: CandidateRegistry) -> None:
    first = _module("registration_user_a", USER_KERNELS)
    candidates.candidate("matmul", target="cpu", name="mine", registry=empty)(
        first.blas_matmul)
    with pytest.raises(ValueError, match=r"'mine' is already registered \(op 'matmul', target "
                       r"'cpu', defined by registration_user_a\.blas_matmul\)"):
        candidates.candidate("matmul", target="cpu", name="mine", registry=empty)(_zeros)
    empty.add(_SubclassKernel("sub", "matmul", "cpu"))
    with pytest.raises(ValueError, match=r"defined by .*test_registration\._SubclassKernel"):
        empty.add(_OtherSubclassKernel("sub", "matmul", "cpu"))
    # but a re-import of the same code replaces silently: pytester's in-process
    # runpytest() imports the same test module again in one process
    module = _module("registration_user_a", USER_KERNELS)
    candidates.candidate("matmul", target="cpu", name="mine", registry=empty)(
        module.blas_matmul)
    assert empty.get("mine").fn is module.blas_matmul
    again = empty.add(_SubclassKernel("sub", "matmul", "cpu"))
    assert empty.get("sub") is again
    # the bundled kernels registered twice into one registry are the same code too
    from pytest_arbiter.runtime import register_bundled

    register_bundled(empty)
    register_bundled(empty)
    assert {"mine", "sub", "blas_matmul", "mma_matmul"} <= {c.name for c in empty}


# -- accepts / available ----------------------------------------------------------------


@pytest.mark.parametrize("what", ["accepts", "available"])
@pytest.mark.parametrize("value", [True, False, "yes", 1])
def test_non_callable_accepts_or_available_is_refused(empty: CandidateRegistry, what: str,
                                                      value: object) -> None:
    with pytest.raises(TypeError, match=f"candidate 'probed': {what} must be callable"):
        candidates.candidate("matmul", target="cpu", name="probed", registry=empty,
                             **{what: value})(_zeros)
    with pytest.raises(TypeError, match=f"candidate 'direct': {what} must be callable"):
        FunctionCandidate(_zeros, "direct", "matmul", "cpu", 0,
                          value if what == "accepts" else None,  # type: ignore[arg-type]
                          value if what == "available" else None)  # type: ignore[arg-type]
    assert "probed" not in empty


# -- alignment and version --------------------------------------------------------------


@pytest.mark.parametrize("align", [(3,), (16, 0), (-8,), (True,), ("16",), (2.0,), 16])
def test_align_values_must_be_positive_powers_of_two(empty: CandidateRegistry,
                                                     align: Any) -> None:
    with pytest.raises(ValueError, match="align"):
        candidates.candidate("matmul", target="cpu", name="bad_align", registry=empty,
                             align=align)(_zeros)
    assert "bad_align" not in empty


def test_align_and_version_are_stored(empty: CandidateRegistry) -> None:
    candidates.candidate("matmul", target="cpu", name="tiled", registry=empty,
                         align=(16, 8, 32), version="2.1")(_zeros)
    cand = empty.get("tiled")
    assert (cand.align, cand.version) == ((16, 8, 32), "2.1")
    plain = FunctionCandidate(np.matmul, "plain", "matmul", "cpu", 0, None, None)
    assert (plain.align, plain.version) == ((), None)


def test_alignment_needs_of_the_bundled_kernels(registry: CandidateRegistry) -> None:
    assert registry.get("panel_matmul").align == (1, 1, 256)
    assert registry.get("mma_matmul").align == (16, 8, 32)
    assert registry.alignment_needs("matmul", "cpu") == (1, 1, 256)
    assert registry.alignment_needs("matmul", "nvidia") == (16, 8, 32)
    assert registry.alignment_needs("softmax", "cpu") == ()
    assert registry.alignment_needs("matmul", "amd") == ()


def test_alignment_needs_is_the_max_per_dimension_and_memoised(
        registry: CandidateRegistry) -> None:
    first = registry.alignment_needs("matmul", "cpu")
    assert registry.alignment_needs("matmul", "cpu") is first  # memoised, not recomputed
    candidates.candidate("matmul", target="cpu", name="wide", registry=registry,
                         align=(16, 8))(_zeros)
    assert registry.alignment_needs("matmul", "cpu") == (16, 8, 256)  # shorter pads with 1
    candidates.candidate("matmul", target="cpu", name="deep", registry=registry,
                         align=(4, 32, 512))(np.matmul)
    assert registry.alignment_needs("matmul", "cpu") == (16, 32, 512)
    registry.remove("deep")
    assert registry.alignment_needs("matmul", "cpu") == (16, 8, 256)


# -- ops --------------------------------------------------------------------------------


def _double(x: np.ndarray) -> np.ndarray:
    return x * 2


def _triple(x: np.ndarray) -> np.ndarray:
    return x * 3


def test_an_op_cannot_be_re_registered_with_another_reference() -> None:
    reg = ops.OpRegistry()
    reg.register(ops.make_op("reg_scale", _double))
    with pytest.raises(ValueError, match=r"op 'reg_scale' is already registered with "
                       r"reference .*test_registration\._double.* reference "
                       r".*test_registration\._triple"):
        reg.register(ops.make_op("reg_scale", _triple))
    assert reg.get("reg_scale").reference is _double
    # the same function, or a re-import of its module, registers again silently
    reg.register(ops.make_op("reg_scale", _double, budget=lambda i, e: np.abs(e) + 1.0))
    reg.register(ops.make_op("reg_user", _module("registration_ops", USER_KERNELS).scale))
    again = _module("registration_ops", USER_KERNELS).scale
    reg.register(ops.make_op("reg_user", again))
    assert reg.get("reg_user").reference is again
    with pytest.raises(ValueError, match="built in"):
        reg.register(ops.make_op("matmul", _double))


def test_the_public_op_refuses_another_reference_too() -> None:
    ops.op("registration_public_scale", reference=_double)
    ops.op("registration_public_scale", reference=_double)
    with pytest.raises(ValueError, match="'registration_public_scale' is already registered"):
        ops.op("registration_public_scale", reference=_triple)


def _f64_reference(x: np.ndarray) -> np.ndarray:
    return np.tanh(x.astype(np.float64)) * 2.0  # computes and returns float64


def test_a_float64_reference_gates_float32_kernels_in_float32(f32: np.ndarray) -> None:
    the_op = ops.make_op("registration_tanh2", _f64_reference)

    def right(x: np.ndarray) -> np.ndarray:
        return (np.tanh(x) * np.float32(2)).astype(np.float32)

    def wide(x: np.ndarray) -> np.ndarray:
        return np.tanh(x.astype(np.float64)) * 2.0

    ok = f4_gate(FunctionCandidate(right, "right", the_op.name, "cpu", 0, None, None),
                      the_op, inputs=(f32,))
    assert ok.passed, ok.summary()
    bad = f4_gate(FunctionCandidate(wide, "wide", the_op.name, "cpu", 0, None, None),
                       the_op, inputs=(f32,))
    assert not bad.passed and bad.rejected
    assert "output dtype float64, expected float32" in bad.summary()


def test_result_dtype_rule(f32: np.ndarray) -> None:
    user = ops.make_op("registration_any", _f64_reference)
    assert ops.result_dtype(user, (f32,), _f64_reference(f32)) == np.float32
    assert ops.result_dtype(user, (f32.astype(np.float16),), np.zeros(1)) == np.float16
    bf16 = f32.astype(bfloat16())
    assert ops.result_dtype(user, (bf16,), np.zeros(1)) == bfloat16()
    assert ops.result_dtype(user, (f32.astype(np.float64),), np.zeros(1, np.float32)) \
        == np.float64
    declared = ops.make_op("registration_declared", _f64_reference, out_dtype="float64")
    assert declared.out_dtype == np.float64
    assert ops.result_dtype(declared, (f32,), _f64_reference(f32)) == np.float64
    assert ops.make_op("registration_bf", _f64_reference, out_dtype="bfloat16").out_dtype \
        == bfloat16()
    with pytest.raises(TypeError, match="out_dtype"):
        ops.make_op("registration_bad", _f64_reference, out_dtype=object())
    matmul = ops.OPS.get("matmul")
    assert ops.result_dtype(matmul, (f32, f32.T), None) == np.float32


def test_an_int64_argmax_reference_stays_int64(f32: np.ndarray) -> None:
    def argmax(x: np.ndarray) -> np.ndarray:
        return np.argmax(x, axis=-1)

    the_op = ops.make_op("registration_argmax", argmax)
    assert ops.result_dtype(the_op, (f32,), argmax(f32)) == np.int64
    report = f4_gate(FunctionCandidate(argmax, "argmax_kernel", the_op.name, "cpu", 0,
                                            None, None), the_op, inputs=(f32,))
    assert report.passed, report.summary()
    as_float = f4_gate(FunctionCandidate(lambda x: argmax(x).astype(np.float32),
                                              "argmax_f32", the_op.name, "cpu", 0, None, None),
                            the_op, inputs=(f32,))
    assert "output dtype float32, expected int64" in as_float.reason


def test_run_reference_casts_to_the_result_dtype(f32: np.ndarray) -> None:
    the_op = ops.make_op("registration_run_ref", _f64_reference)
    out = the_op.run_reference(f32)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, _f64_reference(f32).astype(np.float32))
    declared = ops.make_op("registration_run_ref64", _f64_reference, out_dtype=np.float16)
    assert declared.run_reference(f32).dtype == np.float16
    argmax = ops.make_op("registration_run_argmax", lambda x: np.argmax(x, axis=-1))
    assert argmax.run_reference(f32).dtype == np.int64
    builtin = ops.OPS.get("matmul")
    np.testing.assert_allclose(builtin.run_reference(f32, f32.T), f32 @ f32.T, rtol=1e-5)
    assert builtin.run_reference(f32, f32.T).dtype == np.float32


# -- the gate: error vs rejected --------------------------------------------------------


def test_a_kernel_that_raises_is_an_error_not_a_rejection(registry: CandidateRegistry,
                                                          f32: np.ndarray) -> None:
    def broken(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        raise RuntimeError("launch failed")

    matmul = ops.OPS.get("matmul")
    inputs = (f32, f32.T.copy())
    report = f4_gate(FunctionCandidate(broken, "broken", "matmul", "cpu", 0, None, None),
                          matmul, inputs=inputs)
    assert {t.status for t in report.trials} == {"error"}
    assert report.error == "raised RuntimeError: launch failed"
    assert not report.rejected and not report.passed
    assert "failing input #0" in report.summary()
    assert "raised RuntimeError: launch failed" in report.summary()

    wrong = f4_gate(FunctionCandidate(_zeros, "zeros", "matmul", "cpu", 0, None, None),
                         matmul, inputs=inputs)
    assert wrong.rejected and wrong.error == "" and not wrong.passed
    assert {t.status for t in wrong.trials} == {"fail"}

    good = f4_gate(registry.get("blas_matmul"), matmul, inputs=inputs)
    assert good.passed and not good.rejected and good.error == ""


def test_an_accepts_that_raises_is_an_error(f32: np.ndarray) -> None:
    def picky(*inputs: Any) -> bool:
        raise KeyError("stride")

    report = f4_gate(FunctionCandidate(np.matmul, "picky", "matmul", "cpu", 0, picky,
                                            None), ops.OPS.get("matmul"),
                          inputs=(f32, f32.T.copy()))
    assert report.trials[0].status == "error"
    assert report.error.startswith("accepts() raised KeyError")
    assert not report.passed and not report.rejected


def test_declined_inputs_says_the_dispatch_own_inputs_were_declined(f32: np.ndarray) -> None:
    def only_square(a: np.ndarray, b: np.ndarray) -> bool:
        return bool(a.shape[0] == a.shape[1])

    cand = FunctionCandidate(np.matmul, "square", "matmul", "cpu", 0, only_square, None)
    matmul = ops.OPS.get("matmul")
    ragged = f4_gate(cand, matmul, inputs=(f32, f32.T.copy()))
    assert ragged.declined_inputs
    square = np.ones((8, 8), np.float32)
    ok = f4_gate(cand, matmul, inputs=(square, square))
    assert ok.passed and not ok.declined_inputs
    # without inputs of its own, trial 0 is a generated one, never "the dispatch's"
    from pytest_arbiter.core.regions import MatmulRegion

    alone = f4_gate(cand, matmul, region=MatmulRegion.of(6, 8, 10, "float32"))
    assert not alone.declined_inputs


def test_call_timeout_runs_each_call_under_the_watchdog(monkeypatch: pytest.MonkeyPatch,
                                                        f32: np.ndarray) -> None:
    entered: list[float] = []

    class Stuck(Exception):
        pass

    class Watchdog:
        def __init__(self, seconds: float) -> None:
            self.seconds = seconds

        def __enter__(self) -> None:
            entered.append(self.seconds)

        def __exit__(self, *exc: object) -> None:
            raise Stuck(f"call took longer than {self.seconds}s")

    monkeypatch.setattr(gate, "CallWatch", Watchdog)
    inputs = (f32, f32.T.copy())
    blas = FunctionCandidate(np.matmul, "timed", "matmul", "cpu", 0, None, None)
    report = f4_gate(blas, ops.OPS.get("matmul"), inputs=inputs, call_timeout_s=0.5)
    assert entered and set(entered) == {0.5}
    assert report.error == "raised Stuck: call took longer than 0.5s"
    assert not report.passed and not report.rejected
    # no timeout asked for: no watchdog
    entered.clear()
    assert f4_gate(blas, ops.OPS.get("matmul"), inputs=inputs).passed and not entered


def test_two_lambdas_or_closures_of_one_module_are_two_registrations() -> None:
    """Same module and qualname is a re-import only when the module was imported again."""
    from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
    from pytest_arbiter.core.ops import OpRegistry, make_op

    def factory(k: int) -> Any:
        def scale_fast(x: Any) -> Any:
            return x * k
        return scale_fast

    reg = CandidateRegistry()
    reg.add(FunctionCandidate(factory(2), "scale_fast", "matmul", "cpu", 0, None, None))
    with pytest.raises(ValueError, match="already registered"):
        reg.add(FunctionCandidate(factory(3), "scale_fast", "matmul", "cpu", 0, None, None))
    same = reg.get("scale_fast")
    reg.add(same)  # the very same candidate again: nothing to refuse
    ops = OpRegistry()
    ops.register(make_op("scale_twice", lambda x: x * 2))
    with pytest.raises(ValueError, match="already registered"):
        ops.register(make_op("scale_twice", lambda x: x * 3))


@pytest.mark.parametrize("name", ["a/b", "k\x1b[2J", "with space", "-lead", "x" * 129])
def test_names_outside_the_rule_are_refused_at_registration(name: str) -> None:
    with pytest.raises(ValueError, match="is not allowed"):
        CandidateRegistry().add(FunctionCandidate(len, name, "matmul", "cpu", 0, None, None))
    with pytest.raises(ValueError, match=r"op name .* is not allowed"):
        ops.OpRegistry().register(ops.make_op(name, lambda x: x))


def test_names_inside_the_rule_register() -> None:
    reg = CandidateRegistry()
    reg.add(FunctionCandidate(len, "cuBLAS-v2.fp16+tf32_x", "matmul", "cpu", 0, None, None))
    assert reg.get("cuBLAS-v2.fp16+tf32_x").name == "cuBLAS-v2.fp16+tf32_x"


def test_an_unknown_op_name_is_refused_with_the_closest_known() -> None:
    known = ops.OpRegistry()
    with pytest.raises(KeyError, match=r"unknown op 'softmx' \(did you mean 'softmax'\?\); "
                                       r"registered ops: matmul, softmax"):
        known.get("softmx")
    with pytest.raises(KeyError, match=r"unknown op 'zzz'; registered ops: matmul, softmax"):
        known.get("zzz")
