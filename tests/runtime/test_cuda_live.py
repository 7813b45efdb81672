"""Live gates of the GPU lanes: they run on an NVIDIA (sm_80+) or AMD device, skip elsewhere.

Run on a GPU runner with ``--arbiter-no-skip`` (ci/gpu-check.sh) so a missing device
fails instead of skipping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pytest_arbiter import Arbiter, ComparePolicy, MeasureCache, measured_arbitrate
from pytest_arbiter.core.candidates import Candidate, CandidateRegistry
from pytest_arbiter.extend.backends import DeviceInfo
from pytest_arbiter.extend.device import probe_device
from pytest_arbiter.runtime import cuda
from pytest_arbiter.runtime.cuda import emitted, sources
from pytest_arbiter.runtime.cuda.device import load_cupy
from pytest_arbiter.runtime.cuda.timer import CudaEventTimer
from pytest_arbiter.timing.measure import measure_latency
from tests.runtime.gpu_gates import gate_cases, gpu_candidate, run_gate

NVIDIA = pytest.mark.arbiter_device(*sources.ARCHS)
AMD = pytest.mark.arbiter_device("amd")
POLICY = ComparePolicy(min_rounds=5, max_rounds=40, budget_s=0.05)


@pytest.fixture(scope="module", autouse=True)
def _gpu_preflight() -> None:
    """Before any live test, on a machine with a device: one RawKernel compile and one
    library GEMM; a lane that cannot do them ends the run in one line, instead of an
    error in every gate."""
    from pytest_arbiter.runtime.cuda.preflight import preflight

    for target in ("nvidia", "amd"):
        if isinstance(probe_device(target), DeviceInfo):
            problem = preflight(target)
            if problem is not None:
                pytest.exit(f"GPU preflight failed: {problem}", returncode=3)

@NVIDIA
@pytest.mark.parametrize(("name", "dtype", "shape"), gate_cases("nvidia"))
def test_f4_gate_nvidia(name: str, dtype: str, shape: tuple[int, ...]) -> None:
    run_gate(name, dtype, shape)


@AMD
@pytest.mark.parametrize(("name", "dtype", "shape"), gate_cases("amd"))
def test_f4_gate_amd(name: str, dtype: str, shape: tuple[int, ...]) -> None:
    run_gate(name, dtype, shape)


@AMD
def test_emitted_lane_reports_unavailable_on_rocm() -> None:
    for cand in emitted.candidates():
        assert not cand.available()
        assert "ROCm" in str(cand.unavailable_reason())


def _device_mats(m: int, n: int, k: int, dtype: str) -> tuple[Any, Any]:
    cp = load_cupy()
    rng = np.random.default_rng(m + 7 * n + 13 * k)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    return cp.asarray(a), cp.asarray(b)


class CountingTimer:
    def __init__(self) -> None:
        self.inner = CudaEventTimer(flush_l2=True)
        self.calls = 0

    def sample(self, fn: Callable[[], object]) -> float:
        self.calls += 1
        return self.inner.sample(fn)


@NVIDIA
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_measured_arbitration_over_both_lanes_caches_the_winner(dtype: str) -> None:
    pool: list[Candidate] = [c for c in cuda.candidates() if c.target == "nvidia"]
    a, b = _device_mats(1024, 1024, 1024, dtype)
    cache = MeasureCache()
    timer = CountingTimer()
    sel = measured_arbitrate("matmul", (a, b), pool, cache, target="nvidia", timer=timer,
                             policy=POLICY)
    assert sel.source == "measured" and sel.candidate is not None, sel.passed_over
    assert sel.comparison is not None
    lanes = {"float16": {"cublas_matmul", "mma_matmul"},
             "float32": {"cublas_matmul", "tiled_sgemm"}}[dtype]
    assert set(sel.comparison.stats) == lanes, sel.passed_over
    (entry,) = cache.entries()
    found = probe_device("nvidia")
    assert isinstance(found, DeviceInfo)
    assert entry.device == found.tag and entry.provenance.device_name == found.name
    assert entry.winner == sel.candidate.name == sel.comparison.ranking[0]
    if not sel.comparison.tie:  # the winner is the fastest, round by round
        ratios = sel.comparison.ratios
        assert all(ratios[n] >= ratios[entry.winner] for n in ratios), ratios
    measured = timer.calls
    hit = measured_arbitrate("matmul", (a, b), pool, cache, target="nvidia", timer=timer,
                             policy=POLICY)
    assert hit.source == "cached" and hit.candidate is sel.candidate
    assert timer.calls == measured  # a hit times nothing


@NVIDIA
def test_dispatch_of_device_arrays_stays_on_the_device(registry: CandidateRegistry) -> None:
    cp = load_cupy()
    arb = Arbiter(registry=registry, mode="tune", policy=POLICY)
    a, b = _device_mats(256, 128, 64, "float16")
    out = arb.dispatch("matmul", a, b)
    assert isinstance(out, cp.ndarray) and out.dtype == np.float16
    counts = arb.histogram.counts(target="nvidia")
    assert sum(counts.values()) == 1
    assert all(k[3] == "won" for k in counts), counts


@NVIDIA
def test_tensor_core_lane_forced_onto_a_ragged_shape_hands_it_on() -> None:
    """SPEC bug 1 on the device: the aligned-only winner declines 24x16x32, cuBLAS runs it."""
    found = {c.name: c for c in cuda.candidates()}
    reg = CandidateRegistry()
    mma = found["mma_matmul"]
    mma.tier = 9  # force the emitted lane first
    reg.extend([mma, found["cublas_matmul"]])
    for mode in ("static", "tune"):
        arb = Arbiter(registry=reg, mode=mode, policy=POLICY)
        arb.dispatch("matmul", *_device_mats(32, 16, 32, "float16"))
        if mode == "static":
            assert arb.histogram.counts() == {("nvidia", "matmul", "mma_matmul", "won"): 1}
        before = arb.histogram.counts()
        ragged = _device_mats(24, 16, 32, "float16")
        out = arb.dispatch("matmul", *ragged)
        expected = ragged[0].get().astype(np.float32) @ ragged[1].get().astype(np.float32)
        np.testing.assert_allclose(out.get().astype(np.float32), expected, rtol=2e-2, atol=2e-2)
        delta = arb.histogram.minus(before)
        assert delta == {("nvidia", "matmul", "cublas_matmul", "won"): 1}, (mode, delta)
        event = arb.events[("nvidia", "matmul", "32x16x32/a8.16.32", "float16")]
        assert "declined" in event.passed_over["mma_matmul"], event
    with pytest.raises(ValueError, match="M=24, N=16, K=32"):
        mma.run(*_device_mats(24, 16, 32, "float16"))
    alone = CandidateRegistry()
    alone.add(mma)
    arb = Arbiter(registry=alone, mode="static")
    arb.dispatch("matmul", *_device_mats(24, 16, 32, "float16"))
    # it applied and declined, and nothing else could run it: a degrade named after it
    assert arb.histogram.counts() == {("nvidia", "matmul", "mma_matmul", "degraded"): 1}


@NVIDIA
def test_event_timer_times_device_work() -> None:
    a, b = _device_mats(2048, 2048, 2048, "float16")
    mma = gpu_candidate("mma_matmul")
    cold = measure_latency(mma.run, a, b, warmup=2, repeat=7, timer=CudaEventTimer(True))
    warm = measure_latency(mma.run, a, b, warmup=2, repeat=7, timer=CudaEventTimer(False))
    assert cold.median_ns > 0 and warm.median_ns > 0
    # 2*2048^3 flops: faster than 1 PFLOP/s would mean the timer missed the work
    assert warm.median_ns > 2 * 2048**3 / 1e15 * 1e9


@NVIDIA
def test_modules_are_compiled_once_per_device() -> None:
    cp = load_cupy()
    mma = gpu_candidate("mma_matmul")
    mma.run(*_device_mats(32, 16, 32, "float16"))
    mma.run(*_device_mats(64, 32, 64, "float16"))
    device = int(cp.cuda.runtime.getDevice())
    assert emitted.compiled_modules().count((device, "mma_gemm.cu")) == 1


@pytest.mark.sm120
def test_sm120_runs_the_tensor_core_lane() -> None:
    found = probe_device("nvidia")
    assert isinstance(found, DeviceInfo) and found.tag == "sm_120"
    # 56 KiB of pipeline buffers must fit consumer Blackwell's 99 KiB per block
    run_gate("mma_matmul", "float16", (512, 512, 512))
