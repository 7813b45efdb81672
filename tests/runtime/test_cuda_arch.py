"""Issue 30, point 3: code NVRTC cannot build for this device is refused up front.

CuPy caps NVRTC 12.0-12.7 at sm_90, and an sm_90 cubin does not load on sm_120: every
candidate that compiles (the emitted kernels, CuPy's own softmax kernels) is then
unavailable with the reason, while cuBLAS (precompiled) still runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pytest_arbiter.runtime import cuda
from pytest_arbiter.runtime.cuda.lane import GpuCandidate
from tests.runtime.cuda_fakes import H100, RTX5090, FakeGpu

COMPILING = ("tiled_sgemm", "mma_matmul", "fused_softmax", "cupy_softmax")


def gpu_candidates() -> dict[str, GpuCandidate]:
    return {c.name: c for c in cuda.candidates() if isinstance(c, GpuCandidate)}


def test_nvrtc_12_6_on_sm_120_is_refused_with_the_reason(
        cupy_as: Callable[[Any], None]) -> None:
    cupy_as(FakeGpu(RTX5090, nvrtc=(12, 6)).cp)
    found = gpu_candidates()
    for name in COMPILING:
        reason = str(found[name].unavailable_reason())
        assert "NVRTC 12.6 builds for sm_90 at most" in reason, (name, reason)
        assert "cannot load on sm_120" in reason
    assert found["cublas_matmul"].available()


@pytest.mark.parametrize(("props", "nvrtc"), [(RTX5090, (12, 8)), (RTX5090, (13, 0)),
                                              (H100, (12, 6)), (H100, (12, 0))])
def test_an_nvrtc_that_targets_the_device_is_accepted(cupy_as: Callable[[Any], None],
                                                      props: dict[str, Any],
                                                      nvrtc: tuple[int, int]) -> None:
    cupy_as(FakeGpu(props, nvrtc=nvrtc).cp)
    found = gpu_candidates()
    assert all(found[name].available() for name in COMPILING), {
        n: found[n].unavailable_reason() for n in COMPILING}


def test_ptx_newer_than_the_driver_is_refused(cupy_as: Callable[[Any], None],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_arbiter.runtime.cuda.toolkit import arch_problem

    monkeypatch.setenv("CUPY_COMPILE_WITH_PTX", "1")
    cupy_as(FakeGpu(H100, nvrtc=(13, 5)).cp)  # the fake driver is 13.0
    reason = str(gpu_candidates()["mma_matmul"].unavailable_reason())
    assert "CuPy compiles PTX (CUPY_COMPILE_WITH_PTX=1) with NVRTC 13.5" in reason
    assert arch_problem("sm_120", (12, 6), ptx=True, driver=12080) is None  # PTX JITs
    assert arch_problem("sm_121", (12, 8), ptx=False, driver=None) is None  # one major


def test_the_cap_is_cupys() -> None:
    """``cupy.cuda.compiler._get_max_compute_capability`` of CuPy 14, per NVRTC."""
    from pytest_arbiter.runtime.cuda.toolkit import nvrtc_arch, nvrtc_max_arch

    assert [nvrtc_max_arch(v) for v in [(12, 0), (12, 7), (12, 8), (12, 9), (13, 0)]] == [
        90, 90, 120, 121, 121]
    assert nvrtc_arch(120, (12, 6)) == 90 and nvrtc_arch(87, (12, 0)) == 87  # Tegra
