"""Issue 30, point 1: a fresh runner gets the toolkit libraries, and a missing one is
said once, up front.

The extras bring NVIDIA's NVRTC and cuBLAS wheels (``cupy-cuda1Nx[ctk]``); the extra is
chosen from what is installed; without NVRTC or cuBLAS the candidates that need them are
unavailable with the reason (not an error in every gate); the preflight says it in one
line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_arbiter.runtime import cuda
from pytest_arbiter.runtime.cuda.lane import GpuCandidate
from tests.factories import ROOT
from tests.runtime.cuda_fakes import H100, FakeGpu

NVRTC_MISSING = RuntimeError('Failure finding "libnvrtc.so.13 or libnvrtc.so.12"')
CUBLAS_MISSING = ImportError('Failure finding "libcublasLt.so.13 or libcublasLt.so.12"')


def extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(ROOT / "pyproject.toml", "rb") as f:
        found: dict[str, list[str]] = tomllib.load(f)["project"]["optional-dependencies"]
    return found


def test_the_cuda_extras_bring_the_toolkit_wheels() -> None:
    found = extras()
    assert found["cuda12"] == ["cupy-cuda12x[ctk]>=14.0"]
    assert found["cuda13"] == ["cupy-cuda13x[ctk]>=14.0"]


@pytest.mark.slow  # asks the package index (metadata only, nothing installed)
@pytest.mark.parametrize(("extra", "nvrtc", "cublas"), [
    ("cuda12", "nvidia-cuda-nvrtc-cu12", "nvidia-cublas-cu12"),
    ("cuda13", "nvidia-cuda-nvrtc", "nvidia-cublas"),
])
def test_the_extras_resolve_to_nvrtc_and_cublas(tmp_path: Path, extra: str, nvrtc: str,
                                                cublas: str) -> None:
    report = tmp_path / "report.json"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
             "--report", str(report), *extras()[extra]],
            capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        pytest.skip(f"the package index did not answer for {extra} within 300 s")
    if proc.returncode != 0:
        pytest.skip(f"pip could not resolve {extra} here: {proc.stderr.strip()[-300:]}")
    names = {item["metadata"]["name"] for item in json.loads(report.read_text())["install"]}
    assert {nvrtc, cublas} <= names, sorted(names)


def gpu_candidates() -> dict[str, GpuCandidate]:
    return {c.name: c for c in cuda.candidates() if isinstance(c, GpuCandidate)}


def test_without_nvrtc_the_compiling_candidates_are_unavailable(
        cupy_as: Callable[[Any], None]) -> None:
    cupy_as(FakeGpu(H100, nvrtc=NVRTC_MISSING).cp)
    found = gpu_candidates()
    for name in ("tiled_sgemm", "mma_matmul", "fused_softmax", "cupy_softmax"):
        reason = str(found[name].unavailable_reason())
        assert "NVRTC cannot be loaded" in reason and "[ctk]" in reason, (name, reason)
    assert found["cublas_matmul"].available()


def test_without_cublas_the_library_gemm_is_unavailable(cupy_as: Callable[[Any], None]) -> None:
    cupy_as(FakeGpu(H100, cublas=CUBLAS_MISSING).cp)
    found = gpu_candidates()
    assert "cuBLAS cannot be loaded" in str(found["cublas_matmul"].unavailable_reason())
    assert found["mma_matmul"].available() and found["cupy_softmax"].available()


def test_the_preflight_passes_on_a_working_lane(cupy_as: Callable[[Any], None],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_arbiter.runtime.cuda import preflight

    gpu = FakeGpu(H100)
    cupy_as(gpu.cp)
    assert preflight.main(["nvidia"]) == 0
    assert "compile arbiter_preflight" in gpu.log and "gemm" in gpu.log
    assert capsys.readouterr().out.startswith("GPU preflight passed on sm_90")


@pytest.mark.parametrize(("fake", "words"), [
    (FakeGpu(H100, nvrtc=NVRTC_MISSING), "NVRTC cannot be loaded"),
    (FakeGpu(H100, cublas=CUBLAS_MISSING), "cuBLAS cannot be loaded"),
])
def test_the_preflight_fails_in_one_line(cupy_as: Callable[[Any], None],
                                         capsys: pytest.CaptureFixture[str], fake: FakeGpu,
                                         words: str) -> None:
    from pytest_arbiter.runtime.cuda import preflight

    cupy_as(fake.cp)
    assert preflight.main(["nvidia"]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("GPU preflight failed: sm_90 (NVIDIA H100")
    assert words in out


def test_the_preflight_without_a_device_exits_2(cupy_as: Callable[[Any], None],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_arbiter.runtime.cuda import preflight

    cupy_as(ImportError("No module named 'cupy'"))
    assert preflight.main([]) == 2
    assert "no nvidia device: CuPy is not importable" in capsys.readouterr().out


def test_the_extra_follows_what_is_installed() -> None:
    from pytest_arbiter.runtime.cuda.install import choose_cuda_extra

    def pick(driver: int, installed: dict[str, str], toolkit: int | None = None) -> str:
        return choose_cuda_extra(driver, installed, toolkit)[0]

    assert pick(13, {"cupy-cuda12x": "14.0.1"}) == "cuda12"  # a 13 driver runs 12 too
    assert pick(13, {}, toolkit=12) == "cuda12"
    assert pick(13, {}) == "cuda13"
    assert pick(12, {}) == "cuda12"
    assert pick(12, {}, toolkit=13) == "cuda12"  # a 13 toolkit needs a 13 driver
    chosen, why = choose_cuda_extra(12, {"cupy-cuda13x": "14.2.0"}, None)
    assert chosen == "cuda12" and "driver supports CUDA 12 only" in why


def test_the_nvrtc_wheel_says_the_toolkit_major() -> None:
    from pytest_arbiter.runtime.cuda.install import toolkit_major

    assert toolkit_major({"nvidia-cuda-nvrtc": "13.5.37"}.get) == 13
    assert toolkit_major({"nvidia-cuda-nvrtc-cu12": "12.9.86"}.get) == 12
    assert toolkit_major({}.get) is None


def test_live_gates_start_with_the_preflight() -> None:
    """The live module's first fixture runs the preflight (pytest.exit with its line)."""
    text = (ROOT / "tests" / "runtime" / "test_cuda_live.py").read_text(encoding="utf-8")
    assert "@pytest.fixture(scope=\"module\", autouse=True)" in text
    assert "preflight(" in text and "pytest.exit(" in text
