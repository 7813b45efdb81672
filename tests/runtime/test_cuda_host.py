"""The GPU lanes on a machine without a GPU: probes, reasons, checks, timer, no crash."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pytest_arbiter import Arbiter, ComparePolicy, DeviceInfo
from pytest_arbiter.core.candidates import CandidateRegistry
from pytest_arbiter.core.dtypes import numpy_dtype
from pytest_arbiter.extend import device as core_device
from pytest_arbiter.gating.histogram import NO_CANDIDATE
from pytest_arbiter.runtime import cuda
from pytest_arbiter.runtime.cuda import device as cuda_device, emitted, sources
from pytest_arbiter.runtime.cuda.lane import GpuCandidate
from pytest_arbiter.runtime.cuda.timer import CudaEventTimer

FAST = ComparePolicy(min_rounds=3, max_rounds=10, budget_s=0.005)
GPU_NAMES = {"cublas_matmul", "hipblas_matmul", "cupy_softmax", "cupy_softmax_amd",
             "tiled_sgemm", "mma_matmul", "fused_softmax"}


@pytest.fixture
def no_cupy(cupy_as: Callable[[Any], None]) -> None:
    cupy_as(ImportError("No module named 'cupy'"))


@pytest.fixture
def cupy_forbidden(monkeypatch: pytest.MonkeyPatch, cupy_as: Callable[[Any], None]) -> None:
    """Any attempt to import CuPy fails the test."""
    cupy_as(AssertionError("CuPy must not be imported here"))
    monkeypatch.setitem(sys.modules, "cupy", None)


def gpu_candidates() -> dict[str, GpuCandidate]:
    return {c.name: c for c in cuda.candidates() if isinstance(c, GpuCandidate)}


class FakeRuntime:
    def __init__(self, props: dict[str, Any], *, hip: bool = False, count: int = 1,
                 error: Exception | None = None) -> None:
        self.is_hip = hip
        self._props, self._count, self._error = props, count, error

    def getDeviceCount(self) -> int:
        if self._error is not None:
            raise self._error
        return self._count

    def getDevice(self) -> int:
        return 0

    def getDeviceProperties(self, index: int) -> dict[str, Any]:
        assert index == 0
        return self._props


def fake_cupy(props: dict[str, Any], *, nvrtc: tuple[int, int] = (13, 0), **kw: Any) -> Any:
    """A CuPy whose NVRTC (``nvrtc``) and cuBLAS load."""
    libs = {"nvrtc": SimpleNamespace(getVersion=lambda: nvrtc), "cublas": SimpleNamespace()}
    return SimpleNamespace(cuda=SimpleNamespace(runtime=FakeRuntime(props, **kw), **libs))


H200 = {"name": b"NVIDIA H200", "major": 9, "minor": 0, "l2CacheSize": 60 << 20}
RTX = {"name": b"NVIDIA GeForce RTX 5090", "major": 12, "minor": 0}
STRIX = {"name": b"AMD Radeon 8060S", "gcnArchName": b"gfx1151:sramecc-:xnack-"}


def test_import_leaves_cupy_out_and_registers_the_gpu_lanes() -> None:
    code = ("import json, sys, pytest_arbiter\n"
            "from pytest_arbiter import REGISTRY\n"
            "print(json.dumps(['cupy' in sys.modules, "
            "sorted(c.name for c in REGISTRY if c.target != 'cpu')]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == [False, sorted(GPU_NAMES)]


def test_candidates_cover_both_lanes_and_targets() -> None:
    found = gpu_candidates()
    assert set(found) == GPU_NAMES
    assert {c.target for c in found.values()} == {"nvidia", "amd"}
    assert {n for n, c in found.items() if c.lane == "emitted"} == {
        "tiled_sgemm", "mma_matmul", "fused_softmax"}
    assert all(c.target == "nvidia" for c in found.values() if c.lane == "emitted")
    assert found["cublas_matmul"].dtypes == ("float32", "float16", "bfloat16")


@pytest.mark.parametrize(("props", "kw", "target", "tag", "name"), [
    (H200, {}, "nvidia", "sm_90", "NVIDIA H200"),
    (RTX, {}, "nvidia", "sm_120", "NVIDIA GeForce RTX 5090"),
    (STRIX, {"hip": True}, "amd", "gfx1151", "AMD Radeon 8060S"),
])
def test_device_tags(props: dict[str, Any], kw: dict[str, Any], target: str, tag: str,
                     name: str) -> None:
    assert cuda_device.describe_device(fake_cupy(props, **kw), target) == DeviceInfo(tag, name)


@pytest.mark.parametrize(("cp", "target", "words"), [
    (fake_cupy(H200, hip=True), "nvidia", "ROCm (HIP) build"),
    (fake_cupy(H200), "amd", "CUDA build"),
    (fake_cupy(H200, count=0), "nvidia", "no GPU device"),
    (fake_cupy(H200, error=RuntimeError("cudaErrorInsufficientDriver")), "nvidia",
     "no usable CUDA driver or device: RuntimeError: cudaErrorInsufficientDriver"),
    (fake_cupy({"name": "x"}, hip=True), "amd", "reports no gcnArchName"),
])
def test_no_device_gives_a_reason(cp: Any, target: str, words: str) -> None:
    found = cuda_device.describe_device(cp, target)
    assert isinstance(found, str) and words in found


def test_probe_goes_through_the_core_registry(cupy_as: Callable[[Any], None]) -> None:
    cupy_as(fake_cupy(RTX))
    assert core_device.device_tag("nvidia") == "sm_120"
    assert core_device.device_tag("amd") is None
    assert "CUDA build" in str(core_device.probe_device("amd"))


def test_broken_cupy_import_is_a_reason_not_a_crash(cupy_as: Callable[[Any], None]) -> None:
    cupy_as(OSError("libcudart.so.12: cannot open shared object file"))
    found = core_device.probe_device("nvidia")
    assert isinstance(found, str) and "CuPy failed to import: OSError" in found


def test_cupy_arrays_dispatch_to_their_vendor(cupy_as: Callable[[Any], None]) -> None:
    array_type = type("ndarray", (), {"__module__": "cupy._core.core"})
    cupy_as(fake_cupy(H200))
    assert core_device.target_of_array(array_type()) == "nvidia"
    cupy_as(fake_cupy(STRIX, hip=True))
    assert core_device.target_of_array(array_type()) == "amd"


@pytest.mark.usefixtures("no_cupy")
def test_without_cupy_every_gpu_candidate_is_unavailable_with_the_reason() -> None:
    for cand in gpu_candidates().values():
        assert not cand.available()
        reason = cand.unavailable_reason()
        assert reason is not None and "CuPy is not importable" in reason, cand.name
        assert "pytest-arbiter[cuda12]" in reason


@pytest.mark.usefixtures("no_cupy")
@pytest.mark.parametrize("mode", ["tune", "static"])
@pytest.mark.parametrize("target", ["nvidia", "amd"])
def test_without_cupy_gpu_dispatch_records_no_candidate(registry: CandidateRegistry, mode: str,
                                                        target: str) -> None:
    arb = Arbiter(registry=registry, mode=mode, policy=FAST)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones((4, 2), dtype=np.float32)
    out = arb.dispatch("matmul", a, b, target=target)
    np.testing.assert_allclose(out, a @ b)
    x = np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)
    arb.dispatch("softmax", x, target=target)
    counts = arb.histogram.counts()
    assert counts == {(target, "matmul", NO_CANDIDATE, "no_candidate"): 1,
                      (target, "softmax", NO_CANDIDATE, "no_candidate"): 1}
    event = arb.events[(target, "matmul", "4x2x4/a1.2.4", "float32")]
    gpu = [n for n, c in gpu_candidates().items() if c.target == target and c.op == "matmul"]
    assert gpu and all("CuPy is not importable" in event.passed_over[n] for n in gpu)


@pytest.mark.usefixtures("cupy_forbidden")
@pytest.mark.parametrize("name", ["cublas_matmul", "hipblas_matmul", "tiled_sgemm",
                                  "mma_matmul"])
def test_matmul_wrappers_check_before_touching_cupy(name: str) -> None:
    cand = gpu_candidates()[name]
    dtype = np.float32 if name == "tiled_sgemm" else np.float16
    a, b = np.zeros((32, 64), dtype), np.zeros((48, 16), dtype)
    for call in (cand.run, cand.prepare_inputs):
        with pytest.raises(ValueError, match=r"A is 32x64 \(K=64\) but B is 48x16 \(K=48\)"):
            call(a, b)
    with pytest.raises(ValueError, match="2-D"):
        cand.run(np.zeros((2, 32, 64), dtype), np.zeros((64, 16), dtype))
    with pytest.raises(ValueError, match="dtypes differ"):
        cand.run(np.zeros((32, 64), dtype), np.zeros((64, 16), np.float64))
    with pytest.raises(ValueError, match="not supported"):
        cand.run(np.zeros((32, 64)), np.zeros((64, 16)))
    with pytest.raises(ValueError, match="C-contiguous"):
        cand.run(np.zeros((64, 32), dtype).T, np.zeros((64, 16), dtype))
    with pytest.raises(ValueError, match="takes 2"):
        cand.run(a)
    assert not cand.accepts(a, b)


@pytest.mark.usefixtures("cupy_forbidden")
@pytest.mark.parametrize("name", ["cupy_softmax", "cupy_softmax_amd", "fused_softmax"])
def test_softmax_wrappers_check_before_touching_cupy(name: str) -> None:
    cand = gpu_candidates()[name]
    with pytest.raises(ValueError, match="non-empty last axis"):
        cand.run(np.zeros((4, 0), np.float32))
    with pytest.raises(ValueError, match="not supported"):
        cand.run(np.zeros((4, 8), np.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        cand.run(np.zeros((8, 4), np.float32).T)
    with pytest.raises(ValueError, match="takes 1"):
        cand.run(np.zeros(4, np.float32), np.zeros(4, np.float32))


@pytest.mark.usefixtures("cupy_forbidden")
def test_tensor_core_gemm_declines_what_its_tiling_cannot_run() -> None:
    mma = gpu_candidates()["mma_matmul"]

    def mats(m: int, n: int, k: int, dtype: Any = np.float16) -> tuple[Any, Any]:
        return np.zeros((m, k), dtype), np.zeros((k, n), dtype)

    assert mma.accepts(*mats(32, 16, 32))
    assert mma.accepts(*mats(4096, 4096, 4096))
    assert mma.problem(*mats(32, 16, 32, numpy_dtype("bfloat16"))) is None
    for ragged in [(24, 16, 32), (32, 12, 32), (32, 16, 48), (33, 17, 33)]:
        assert not mma.accepts(*mats(*ragged))
        assert "not aligned to the tensor-core tiling" in str(mma.problem(*mats(*ragged)))
    assert not mma.accepts(*mats(32, 16, 32, np.float32))
    with pytest.raises(ValueError, match="M=24, N=16, K=32"):
        mma.run(*mats(24, 16, 32))


@pytest.mark.usefixtures("cupy_forbidden")
def test_misaligned_device_pointer_is_declined() -> None:
    array_type = type("ndarray", (), {"__module__": "cupy._core.core"})

    def device_array(ptr: int) -> Any:
        x = array_type()
        x.shape, x.ndim, x.dtype = (32, 32), 2, np.dtype(np.float16)
        x.flags = SimpleNamespace(c_contiguous=True)
        x.data = SimpleNamespace(ptr=ptr)
        return x

    mma = gpu_candidates()["mma_matmul"]
    assert mma.problem(device_array(0x7f0000000000), device_array(0x7f0000001000)) is None
    assert "16-byte aligned" in str(mma.problem(device_array(0x7f0000000002),
                                                device_array(0x7f0000001000)))


def test_sgemm_takes_any_float32_shape() -> None:
    sgemm = gpu_candidates()["tiled_sgemm"]
    assert sgemm.problem(np.zeros((24, 33), np.float32), np.zeros((33, 7), np.float32)) is None
    assert sgemm.problem(np.zeros((2, 2), np.float16), np.zeros((2, 2), np.float16))


def test_emitted_lane_needs_sm80_on_nvidia(cupy_as: Callable[[Any], None]) -> None:
    cupy_as(fake_cupy(H200))
    mma = gpu_candidates()["mma_matmul"]
    assert isinstance(mma, emitted.EmittedCandidate)
    assert "sm_80 or newer" in str(mma.device_problem(DeviceInfo("sm_75", "Tesla T4")))
    assert mma.device_problem(DeviceInfo("sm_90", "NVIDIA H200")) is None
    assert mma.device_problem(DeviceInfo("sm_120", "RTX 5090")) is None


def test_emitted_lane_is_unavailable_on_rocm_with_the_reason(
        cupy_as: Callable[[Any], None]) -> None:
    cupy_as(fake_cupy(STRIX, hip=True))
    found = gpu_candidates()
    for name in ("tiled_sgemm", "mma_matmul", "fused_softmax"):
        assert "ROCm (HIP) build" in str(found[name].unavailable_reason())
        assert "NVIDIA-only" in str(found[name].device_problem(DeviceInfo("gfx1151", "x")))
    for name in ("hipblas_matmul", "cupy_softmax_amd"):
        assert found[name].available()
    assert "bfloat16" not in found["hipblas_matmul"].dtypes


@pytest.mark.parametrize(("n", "threads"), [(1, 32), (256, 32), (257, 64), (4096, 512),
                                            (10**6, 1024)])
def test_softmax_block_size(n: int, threads: int) -> None:
    assert emitted.softmax_threads(n) == threads


def test_sources_share_their_options_and_fit_shared_memory() -> None:
    for src in sources.SOURCES:
        text = src.text()
        for fn in src.functions:
            assert f"{fn}(" in text and 'extern "C"' in text
        for name, value in src.defines:
            assert f"#ifndef {name}" in text
            assert f"-D{name}={value}" in src.options()
        # NVRTC must not need an include path: the shim is inlined, and the one include
        # left is the emulator's, behind a macro NVRTC never defines
        includes = re.findall(r"^#include .*$", text, re.MULTILINE)
        assert includes in ([], ['#include "ptx_emulated.cuh"']), includes
        assert "#include" not in text.split("#ifdef ARBITER_HOST_EMULATION")[0]
    assert sources.mma_shared_bytes() == 3 * (128 * 40 + 32 * 136) * 2
    assert sources.mma_shared_bytes() <= 99 * 1024  # the per-block cap of sm_86/89/120
    cmd = sources.MMA_GEMM.nvcc_command("nvcc", ("sm_90",), "out.fatbin")
    assert "-gencode=arch=compute_90,code=sm_90" in cmd and "-DGEMM_STAGES=3" in cmd


class FakeEvent:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def record(self) -> None:
        self.log.append(f"record {self.name}")

    @property
    def done(self) -> bool:
        self.log.append(f"query {self.name}")
        return True


def timer_cupy(log: list[str], l2: int) -> Any:
    events = iter(["start", "stop"])
    memory = SimpleNamespace(memset_async=lambda value, size: log.append(f"flush {size}"))

    def empty(size: int, dtype: Any) -> Any:
        log.append(f"alloc {size}")
        return SimpleNamespace(data=memory, nbytes=size)

    def event(disable_timing: bool = False) -> FakeEvent:
        return FakeEvent(log, "wait" if disable_timing else next(events))

    runtime = FakeRuntime({"l2CacheSize": l2})
    cuda_ns = SimpleNamespace(Event=event, runtime=runtime,
                              get_elapsed_time=lambda start, stop: 1.5)
    return SimpleNamespace(cuda=cuda_ns, empty=empty, uint8=np.uint8)


@pytest.mark.parametrize("flush", [True, False])
def test_event_timer_flushes_l2_outside_the_timed_span(cupy_as: Callable[[Any], None],
                                                       flush: bool) -> None:
    log: list[str] = []
    cupy_as(timer_cupy(log, 50 << 20))
    timer = CudaEventTimer(flush_l2=flush)

    def call() -> None:
        log.append("call")

    assert timer.sample(call) == pytest.approx(1.5e6)
    timer.sample(call)
    rep = ["flush 104857600"] if flush else []
    timed = [*rep, "record start", "call", "record stop", "query stop"]
    # the first sample of a function starts with one untimed call, waited for
    assert log == [*(["alloc 104857600"] if flush else []),
                   "call", "record wait", "query wait", *timed, *timed]


def test_event_timer_is_the_gpu_targets_timer() -> None:
    from pytest_arbiter.decision.timers import timer_for

    assert isinstance(timer_for("nvidia"), CudaEventTimer)
    assert timer_for("nvidia") is timer_for("amd")
    assert timer_for("nvidia").flush_l2
