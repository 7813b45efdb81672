"""Host-free runs of the emitted lane's CUDA kernels on a CPU emulation of the device.

The kernels run through the runtime's own launch code (``EmittedCandidate.run``: the
checks, the grid, the block, the dynamic shared memory and its opt-in, the argument order)
with CuPy replaced by :mod:`cuda_emulation.emulated_cupy` (``tools/cuda_emulation/``, on
the path through pytest's ``pythonpath``), which compiles the bundled ``.cu`` text and
options with the host C++ compiler against ``emulator.h``: the kernels' ``ptx_shim.cuh``
then takes each PTX instruction's CPU twin from ``ptx_emulated.cuh``.
What this proves: the index arithmetic, tiling, predication, ``cp.async`` pipeline order,
barriers and fragment layouts agree with the PTX ISA's description of the instructions,
the F4 gate passes, no access leaves its buffer, and (under ThreadSanitizer) no plain load
or store races inside a barrier interval. What it cannot prove: the inline asm wrappers'
operand lists themselves (the emulation replaces them) and speed (docs/gpu.md). The live
gates (test_cuda_live.py) do.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
from cuda_emulation.emulated_cupy import (
    Builder,
    EmulatedCupy,
    EmulatedKernelError,
    Schedule,
    find_compiler,
    thread_sanitizer_problem,
)
from hypothesis import HealthCheck, given, settings, strategies as st

from pytest_arbiter import Arbiter
from pytest_arbiter.core.candidates import CandidateRegistry
from pytest_arbiter.core.dtypes import numpy_dtype
from pytest_arbiter.core.ops import OPS
from pytest_arbiter.runtime.cuda import emitted, sources
from tests.factories import ROOT
from tests.runtime.gpu_gates import gate_cases, gpu_candidate, run_gate


def _compiler() -> tuple[str | None, str]:
    try:
        return find_compiler(), ""
    except LookupError as exc:
        return None, str(exc)


COMPILER, NO_COMPILER = _compiler()
pytestmark = [pytest.mark.emulated, pytest.mark.skipif(
    COMPILER is None, reason=f"the CUDA emulator needs a host C++ compiler: {NO_COMPILER}")]

SCHEDULES = [Schedule("forward", "lazy"), Schedule("reverse", "eager"),
             Schedule("shuffled:1", "lazy"), Schedule("shuffled:2", "eager")]


@pytest.fixture(scope="session")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    """Every bundled kernel function compiled for the emulator once, two at a time."""
    assert COMPILER is not None
    built = Builder(tmp_path_factory.mktemp("cuda-emulation"), COMPILER)
    jobs = [(src, fn) for src in sources.SOURCES for fn in src.functions]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda job: built.build(job[0].text(), job[0].options(), job[1]), jobs))
    return built


@pytest.fixture
def emulate(builder: Builder, cupy_as: Callable[[Any], None],
            monkeypatch: pytest.MonkeyPatch) -> Callable[..., EmulatedCupy]:
    """Install an emulated sm_90 as the CuPy device: ``emulate(Schedule(...))``."""

    def install(schedule: Schedule | None = None, *, major: int = 9, minor: int = 0,
                racecheck: bool = False) -> EmulatedCupy:
        # the runtime caches compiled functions per device id: start each device afresh
        monkeypatch.setattr(emitted, "_MODULES", {})
        monkeypatch.setattr(emitted, "_FUNCTIONS", {})
        cp = EmulatedCupy(builder, major=major, minor=minor, schedule=schedule or Schedule(),
                          racecheck=racecheck)
        # what the lane asks of a real CuPy besides the launch: NVRTC's version (the
        # emulator builds with the host compiler) and events, done at once (a launch
        # runs to its end before it returns)
        cp.cuda.nvrtc = SimpleNamespace(getVersion=lambda: (13, 0))
        cp.cuda.Event = lambda disable_timing=False: SimpleNamespace(
            record=lambda: None, done=True)
        cupy_as(cp)
        return cp

    return install


def _operands(name: str, dtype: str, shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(sum(shape))
    if name == "fused_softmax":
        return ((rng.standard_normal(shape) * 4).astype(numpy_dtype(dtype)),)
    m, n, k = shape
    return (rng.standard_normal((m, k)).astype(numpy_dtype(dtype)),
            rng.standard_normal((k, n)).astype(numpy_dtype(dtype)))


@pytest.mark.parametrize(("name", "dtype", "shape"), gate_cases("nvidia", lane="emitted"))
def test_f4_gate_of_the_emitted_kernels_on_the_emulated_device(
        emulate: Callable[..., EmulatedCupy], name: str, dtype: str,
        shape: tuple[int, ...]) -> None:
    cp = emulate()
    run_gate(name, dtype, shape)
    assert cp.log, "the gate ran no kernel on the emulator"


@pytest.mark.parametrize(("name", "dtype", "shape"), [
    ("mma_matmul", "float16", (272, 136, 96)),
    ("mma_matmul", "bfloat16", (144, 264, 64)),
    ("tiled_sgemm", "float32", (131, 129, 17)),
    ("fused_softmax", "float16", (3, 2500)),
])
def test_every_thread_order_and_copy_timing_gives_the_same_bits(
        emulate: Callable[..., EmulatedCupy], name: str, dtype: str,
        shape: tuple[int, ...]) -> None:
    """A missing barrier or an early read of a pipeline stage changes the result under some
    schedule (the emulator also stops on a shared-memory race); none does."""
    inputs = _operands(name, dtype, shape)
    results = []
    for schedule in SCHEDULES:
        emulate(schedule)
        results.append(gpu_candidate(name).run(*inputs))
    first = results[0].view(np.uint8)
    assert not np.isnan(results[0].astype(np.float32)).any()
    for schedule, other in zip(SCHEDULES[1:], results[1:], strict=True):
        assert np.array_equal(first, other.view(np.uint8)), schedule


def test_inputs_are_left_as_they_were(emulate: Callable[..., EmulatedCupy]) -> None:
    """The launch hands the kernel the caller's device arrays; only the output changes."""
    cp = emulate()
    for name, dtype, shape in [("mma_matmul", "float16", (128, 64, 32)),
                               ("tiled_sgemm", "float32", (33, 65, 9)),
                               ("fused_softmax", "bfloat16", (4, 300))]:
        inputs = _operands(name, dtype, shape)
        kept = [x.copy() for x in inputs]
        device_inputs = [cp.asarray(x) for x in inputs]
        gpu_candidate(name).launch(cp, *device_inputs)
        for before, after in zip(kept, device_inputs, strict=True):
            assert np.array_equal(before.view(np.uint8), after.view(np.uint8)), name


def test_tensor_core_lane_forced_onto_a_ragged_shape_declines_on_the_emulated_device(
        emulate: Callable[..., EmulatedCupy]) -> None:
    """SPEC bug 1: aligned 32x16x32 runs the kernel; ragged 24x16x32 is declined before
    any launch, and with nothing else to run it the dispatch records a degrade."""
    cp = emulate()
    mma = gpu_candidate("mma_matmul")
    reg = CandidateRegistry()
    reg.add(mma)
    arb = Arbiter(registry=reg, mode="static")
    a, b = _operands("mma_matmul", "float16", (32, 16, 32))
    out = arb.dispatch("matmul", a, b, target="nvidia")
    np.testing.assert_allclose(out.astype(np.float32),
                               a.astype(np.float32) @ b.astype(np.float32), rtol=1e-2, atol=1e-2)
    assert arb.histogram.counts() == {("nvidia", "matmul", "mma_matmul", "won"): 1}
    launched = len(cp.log)
    ragged = _operands("mma_matmul", "float16", (24, 16, 32))
    arb.dispatch("matmul", *ragged, target="nvidia")
    assert len(cp.log) == launched, "the ragged shape reached the kernel"
    # it applied and declined, and nothing else could run it: a degrade, named after it
    assert arb.histogram.counts()[("nvidia", "matmul", "mma_matmul", "degraded")] == 1


def test_emitted_lane_is_unavailable_below_sm80_on_the_emulated_device(
        emulate: Callable[..., EmulatedCupy]) -> None:
    emulate(major=7, minor=5)
    mma = gpu_candidate("mma_matmul")
    assert not mma.available()
    assert "sm_80 or newer" in str(mma.unavailable_reason())


def test_pipeline_shared_memory_needs_the_opt_in(emulate: Callable[..., EmulatedCupy]) -> None:
    """56 KiB of dynamic shared memory is over CUDA's 48 KiB default: the launch code must
    raise the function's limit first, as ``emitted.kernel`` does."""
    cp = emulate()
    smem = sources.mma_shared_bytes()
    assert smem > 48 * 1024
    fn = cp.RawModule(code=sources.MMA_GEMM.text(), options=sources.MMA_GEMM.options()) \
        .get_function("mma_gemm_f16")
    a, b = (cp.asarray(x) for x in _operands("mma_matmul", "float16", (128, 128, 32)))
    out = cp.empty((128, 128), dtype=a.dtype)
    args = (a, b, out, np.int32(128), np.int32(128), np.int32(32))
    with pytest.raises(EmulatedKernelError, match="max_dynamic_shared_size_bytes"):
        fn((1, 1), (256,), args, shared_mem=smem)
    fn.max_dynamic_shared_size_bytes = smem
    fn((1, 1), (256,), args, shared_mem=smem)
    np.testing.assert_allclose(out.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32),
                               rtol=1e-2, atol=5e-2)


# -- the emulator catches real kernel bugs ---------------------------------------------------
#
# Each mutant is the bundled source with one plausible mistake, and the words of the
# failure that must catch it: an emulator error, a crash in a guard region, or the F4 gate.

MUTANTS = {
    "pipeline waits for one stage too few": (
        "mma_gemm.cu", "cp_async_wait<GEMM_STAGES - 2>();", "cp_async_wait<GEMM_STAGES - 1>();",
        "still in flight"),
    "no barrier before reading a stage": (
        "mma_gemm.cu", "        cp_async_wait<GEMM_STAGES - 2>();\n        __syncthreads();",
        "        cp_async_wait<GEMM_STAGES - 2>();", "data race on shared bytes"),
    "B fragments loaded without the transpose": (
        "mma_gemm.cu", "ldmatrix_x4_trans(r, smem_addr(bs", "ldmatrix_x4(r, smem_addr(bs",
        "F4 gate FAILED"),
    "B fragments of two n8 tiles swapped": (
        "mma_gemm.cu", "b_frag[2 * j][1] = r[1];", "b_frag[2 * j][1] = r[3];", "F4 gate FAILED"),
    "columns stored past N": (
        "mma_gemm.cu", "            if (col < N) {", "            {", "SIGSEGV"),
    "A rows read past M (SPEC bug 2)": (
        "sgemm.cu", "(gr < M && gc < K) ? A[", "(gc < K) ? A[", "SIGSEGV"),
    "SGEMM reads the tile before every thread stored it": (
        "sgemm.cu", "        __syncthreads();\n#pragma unroll\n        for (int k = 0;",
        "#pragma unroll\n        for (int k = 0;", "F4 gate FAILED"),
    "softmax sums over one warp only": (
        "softmax.cu", "v = lane < warps ? scratch[lane]", "v = lane < 1 ? scratch[lane]",
        "F4 gate FAILED"),
    "softmax stores one element past each row": (
        "softmax.cu", "i < n; i += blockDim.x)\n        yr[i]",
        "i <= n; i += blockDim.x)\n        yr[i]", "a store landed outside"),
}

MUTANT_CASES = {"mma_gemm.cu": ("mma_matmul", "float16", (272, 136, 96)),
                "sgemm.cu": ("tiled_sgemm", "float32", (272, 136, 24)),
                "softmax.cu": ("fused_softmax", "float32", (2, 4097))}


@pytest.fixture
def mutate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str, str], None]:
    def apply(file: str, old: str, new: str) -> None:
        for src in sources.KERNEL_DIR.glob("*.cu*"):  # the kernels and ptx_shim.cuh
            shutil.copy(src, tmp_path / src.name)
        text = (tmp_path / file).read_text(encoding="utf-8")
        assert text.count(old) == 1, f"the mutant's anchor is not unique in {file}: {old!r}"
        (tmp_path / file).write_text(text.replace(old, new), encoding="utf-8")
        monkeypatch.setattr(sources, "KERNEL_DIR", tmp_path)

    return apply


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_the_emulated_run_fails_a_mutant_kernel(
        emulate: Callable[..., EmulatedCupy], mutate: Callable[[str, str, str], None],
        mutant: str) -> None:
    file, old, new, caught_by = MUTANTS[mutant]
    mutate(file, old, new)
    emulate()
    name, dtype, shape = MUTANT_CASES[file]
    with pytest.raises((EmulatedKernelError, AssertionError)) as caught:
        out = gpu_candidate(name).run(*_operands(name, dtype, shape))
        run_gate(name, dtype, shape)
        raise AssertionError(f"not caught: {out.ravel()[:4]}")
    message = str(caught.value)
    assert re.search(caught_by, message), message


# -- the emulator's own rules ------------------------------------------------------------------

RULE_BREAKERS = {
    "half_warp_shuffle": ("""
extern "C" __global__ void half_warp_shuffle(float* out) {
    float v = static_cast<float>(threadIdx.x);
    if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}""", "deadlock"),
    "barrier_after_early_exit": ("""
extern "C" __global__ void barrier_after_early_exit(float* out) {
    if (threadIdx.x >= 32) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}""", "the other 32 have exited"),
    "misaligned_ldmatrix": ("""
extern "C" __global__ void misaligned_ldmatrix(float* out) {
    unsigned r[4];
    const unsigned row = emu::ptx::cvta_to_shared(emu::g.smem + 8 + 16 * (threadIdx.x % 8));
    emu::ptx::ldmatrix_x4<false>(r, row);
    out[threadIdx.x] = static_cast<float>(r[0]);
}""", "not 16-byte aligned"),
    "read_of_a_copy_in_flight": ("""
extern "C" __global__ void read_of_a_copy_in_flight(float* out) {
    unsigned r[4];
    const unsigned row = emu::ptx::cvta_to_shared(emu::g.smem + 16 * threadIdx.x);
    emu::ptx::cp_async_cg_16(row, out + 4 * (threadIdx.x % 16), 16);
    emu::ptx::cp_async_commit_group();
    emu::ptx::ldmatrix_x4<false>(r, row);  // no wait_group: the copy may not have landed
    emu::ptx::cp_async_wait_group(0);
    out[threadIdx.x] = static_cast<float>(r[0]);
}""", "still in flight"),
    "shared_read_past_the_allocation": ("""
extern "C" __global__ void shared_read_past_the_allocation(float* out) {
    unsigned r[4];
    emu::ptx::ldmatrix_x4<false>(r, emu::ptx::cvta_to_shared(emu::g.smem) + 1024);
    out[threadIdx.x] = static_cast<float>(r[0]);
}""", "past the 1024-byte allocation"),
}


@pytest.mark.parametrize("kernel", list(RULE_BREAKERS))
def test_the_emulator_stops_a_kernel_that_breaks_the_execution_model(
        builder: Builder, kernel: str) -> None:
    code, words = RULE_BREAKERS[kernel]
    cp = EmulatedCupy(builder)
    fn = cp.RawModule(code=code, options=("-std=c++17",)).get_function(kernel)
    out = cp.zeros(64, dtype=np.float32)
    with pytest.raises(EmulatedKernelError, match=words):
        fn((1,), (64,), (out,), shared_mem=1024)


def _ldmatrix_counts(log: list[str]) -> tuple[int, int]:
    found = re.search(r"(\d+) ldmatrix phases, (\d+) with bank conflicts", log[-1])
    assert found, log[-1]
    return int(found[1]), int(found[2])


def test_tensor_core_gemm_reads_shared_memory_without_bank_conflicts(
        emulate: Callable[..., EmulatedCupy], mutate: Callable[[str, str, str], None]) -> None:
    """The kernel pads each shared row by 8 elements so the eight 16-byte rows of an
    ldmatrix phase fall in distinct banks; without the pad every phase conflicts."""
    a, b = _operands("mma_matmul", "float16", (128, 128, 64))
    cp = emulate()
    gpu_candidate("mma_matmul").run(a, b)
    phases, conflicted = _ldmatrix_counts(cp.log)
    # 2 k-tiles x 2 k16 steps x 8 warps x (4 A + 2 B) ldmatrix.x4 x 4 phases
    assert (phases, conflicted) == (2 * 2 * 8 * 6 * 4, 0)
    mutate("mma_gemm.cu", "#define PAD 8\n", "#define PAD 0\n")
    unpadded = emulate()
    gpu_candidate("mma_matmul").run(a, b)
    assert _ldmatrix_counts(unpadded.log) == (phases, phases)


def test_sm120_gate_of_the_tensor_core_lane_on_the_emulated_device(
        emulate: Callable[..., EmulatedCupy]) -> None:
    """The live sm120 test's gate, on an emulated sm_120: the 56 KiB pipeline fits consumer
    Blackwell's 99 KiB of shared memory per block."""
    cp = emulate(major=12, minor=0)
    assert cp.props["sharedMemPerBlockOptin"] == 99 * 1024
    run_gate("mma_matmul", "float16", (512, 512, 512))


def test_launches_the_hardware_would_refuse_are_refused(
        emulate: Callable[..., EmulatedCupy]) -> None:
    cp = emulate()
    fn = cp.RawModule(code=sources.MMA_GEMM.text(), options=sources.MMA_GEMM.options()) \
        .get_function("mma_gemm_f16")
    fn.max_dynamic_shared_size_bytes = sources.mma_shared_bytes()
    a, b = (cp.asarray(x) for x in _operands("mma_matmul", "float16", (128, 128, 32)))
    out = cp.empty((128, 128), dtype=a.dtype)
    sizes = (np.int32(128), np.int32(128), np.int32(32))
    with pytest.raises(EmulatedKernelError, match="__launch_bounds__ of 256"):
        fn((1, 1), (512,), (a, b, out, *sizes), shared_mem=sources.mma_shared_bytes())
    with pytest.raises(TypeError, match="host"):
        fn((1, 1), (256,), (np.asarray(a), b, out, *sizes), shared_mem=sources.mma_shared_bytes())
    with pytest.raises(EmulatedKernelError, match="overlaps"):
        fn((1, 1), (256,), (a, b, a, *sizes), shared_mem=sources.mma_shared_bytes())


# -- any shape the kernels accept ---------------------------------------------------------------

PROPERTY = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _assert_within_budget(name: str, inputs: tuple[np.ndarray, ...]) -> None:
    cand = gpu_candidate(name)
    assert cand.accepts(*inputs), cand.problem(*inputs)
    out = cand.run(*inputs)
    op = OPS.get(cand.op)
    exact = op.exact(*inputs)
    err = np.abs(out.astype(np.float64) - exact)
    allowed = op.budget(list(inputs), exact)
    worst = float((err / allowed).max()) if err.size else 0.0
    assert out.dtype == inputs[0].dtype and worst <= 1.0, (name, out.shape, worst)


@PROPERTY
@given(m=st.integers(1, 300), n=st.integers(1, 300), k=st.integers(1, 40))
def test_tiled_sgemm_runs_any_shape_on_the_emulated_device(
        emulate: Callable[..., EmulatedCupy], m: int, n: int, k: int) -> None:
    emulate()
    _assert_within_budget("tiled_sgemm", _operands("tiled_sgemm", "float32", (m, n, k)))


@PROPERTY
@given(m16=st.integers(1, 20), n8=st.integers(1, 40), k32=st.integers(1, 4),
       dtype=st.sampled_from(["float16", "bfloat16"]))
def test_tensor_core_gemm_runs_aligned_shapes_on_the_emulated_device(
        emulate: Callable[..., EmulatedCupy], m16: int, n8: int, k32: int, dtype: str) -> None:
    emulate()
    shape = (16 * m16, 8 * n8, 32 * k32)
    _assert_within_budget("mma_matmul", _operands("mma_matmul", dtype, shape))


@PROPERTY
@given(rows=st.integers(1, 4), n=st.integers(1, 5000),
       dtype=st.sampled_from(["float32", "float16", "bfloat16"]))
def test_fused_softmax_runs_any_row_length_on_the_emulated_device(
        emulate: Callable[..., EmulatedCupy], rows: int, n: int, dtype: str) -> None:
    emulate()
    _assert_within_budget("fused_softmax", _operands("fused_softmax", dtype, (rows, n)))


def _sanitizer_driver() -> ModuleType:
    path = ROOT / "ci" / "sanitize_emitted.py"
    spec = importlib.util.spec_from_file_location("sanitize_emitted", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sanitizer_driver_gates_every_emitted_kernel_on_the_emulated_device(
        emulate: Callable[..., EmulatedCupy], mutate: Callable[[str, str, str], None],
        capsys: pytest.CaptureFixture[str]) -> None:
    """ci/sanitize_emitted.py, which gpu-check.sh runs under compute-sanitizer."""
    driver = _sanitizer_driver()
    emulate()
    assert driver.main() == 0
    out = capsys.readouterr().out
    assert out.count(": passed,") == len(driver.CASES), out
    mutate(*MUTANTS["softmax sums over one warp only"][:3])
    emulate()
    assert driver.main() == 1
    assert "fused_softmax" in capsys.readouterr().out


# -- ThreadSanitizer over plain memory accesses ------------------------------------------------

RACE_CASES = [("tiled_sgemm", "float32", (131, 129, 17)),
              ("mma_matmul", "float16", (144, 136, 64)),
              ("fused_softmax", "float16", (3, 2500))]

# A race through plain loads and stores of a static shared array that the plain emulation
# runs without a wrong bit (its threads switch only at barriers and collectives), and
# ThreadSanitizer reports. (SGEMM without its second barrier computes wrong numbers in the
# plain emulation already.)
TSAN_MUTANTS = {
    "softmax reuses its scratch before every warp has read it": (
        "softmax.cu",
        "    __syncthreads();  // scratch may still be read by the previous reduction\n", ""),
}
TSAN_CASES = {"softmax.cu": ("fused_softmax", "float32", (2, 4097))}


@pytest.fixture(scope="session")
def thread_sanitizer(builder: Builder) -> None:
    problem = thread_sanitizer_problem(builder.compiler, builder.directory)
    if problem is not None:
        pytest.skip(problem)


@pytest.mark.usefixtures("thread_sanitizer")
@pytest.mark.parametrize(("name", "dtype", "shape"), RACE_CASES)
def test_no_data_race_under_thread_sanitizer(
        emulate: Callable[..., EmulatedCupy], name: str, dtype: str,
        shape: tuple[int, ...]) -> None:
    cp = emulate(racecheck=True)
    _assert_within_budget(name, _operands(name, dtype, shape))
    assert cp.log


@pytest.mark.usefixtures("thread_sanitizer")
@pytest.mark.parametrize("mutant", list(TSAN_MUTANTS))
def test_thread_sanitizer_catches_a_race_the_plain_emulation_cannot(
        emulate: Callable[..., EmulatedCupy], mutate: Callable[[str, str, str], None],
        mutant: str) -> None:
    file, old, new = TSAN_MUTANTS[mutant]
    mutate(file, old, new)
    name, dtype, shape = TSAN_CASES[file]
    emulate()
    _assert_within_budget(name, _operands(name, dtype, shape))  # no wrong bit without it
    emulate(racecheck=True)
    with pytest.raises(EmulatedKernelError, match=r"data race \(ThreadSanitizer\).*block_reduce"):
        gpu_candidate(name).run(*_operands(name, dtype, shape))


RACY_UNDER_TSAN = {
    "static_shared_between_warps": """
extern "C" __global__ void static_shared_between_warps(float* out) {
    __shared__ float s[64];
    s[threadIdx.x] = 1.0f;
    __syncthreads();
    if (threadIdx.x == 0) s[0] = 2.0f;
    if (threadIdx.x == 32) out[0] = s[0];  // warp 1 reads what warp 0 writes, no barrier
    __syncthreads();
}""",
    "plain_store_under_ldmatrix": """
extern "C" __global__ void plain_store_under_ldmatrix(float* out) {
    unsigned short* h = reinterpret_cast<unsigned short*>(emu::g.smem);
    __syncthreads();
    if (threadIdx.x >= 32) h[(threadIdx.x - 32) * 8] = 1;  // warp 1 stores the rows...
    if (threadIdx.x < 32) {  // ...that warp 0 loads with ldmatrix, no barrier between
        unsigned r[4];
        emu::ptx::ldmatrix_x4<false>(r, emu::ptx::cvta_to_shared(emu::g.smem + 16 * threadIdx.x));
        out[threadIdx.x] = static_cast<float>(r[0]);
    }
    __syncthreads();
}""",
}

CLEAN_UNDER_TSAN = """
extern "C" __global__ void tree_sum(const float* in, float* out, int n) {
    __shared__ float partial[256];
    float acc = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += in[blockIdx.x * n + i];
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}"""


@pytest.mark.usefixtures("thread_sanitizer")
@pytest.mark.parametrize("kernel", list(RACY_UNDER_TSAN))
def test_thread_sanitizer_reports_plain_accesses_that_race(builder: Builder, kernel: str) -> None:
    cp = EmulatedCupy(builder, racecheck=True)
    fn = cp.RawModule(code=RACY_UNDER_TSAN[kernel], options=("-std=c++17",)).get_function(kernel)
    with pytest.raises(EmulatedKernelError, match=rf"data race \(ThreadSanitizer\).*{kernel}"):
        fn((1,), (64,), (cp.zeros(64, dtype=np.float32),), shared_mem=1024)


@pytest.mark.usefixtures("thread_sanitizer")
def test_thread_sanitizer_passes_a_correct_reduction_over_shuffled_blocks(
        builder: Builder) -> None:
    cp = EmulatedCupy(builder, racecheck=True, schedule=Schedule("shuffled:3", "lazy"))
    fn = cp.RawModule(code=CLEAN_UNDER_TSAN, options=("-std=c++17",)).get_function("tree_sum")
    values = np.arange(4 * 300, dtype=np.float32).reshape(4, 300)
    out = cp.zeros(4, dtype=np.float32)
    fn((4,), (256,), (cp.asarray(values), out, np.int32(300)))
    np.testing.assert_allclose(out, values.sum(axis=1, dtype=np.float64), rtol=1e-6)
