"""bench/gpu_gemm.py and ci/sanitize_emitted.py: a clean exit without a GPU; the table."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from pytest_arbiter import DeviceInfo
from pytest_arbiter.extend import device as core_device
from tests.factories import ROOT

SCRIPT = ROOT / "bench" / "gpu_gemm.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("gpu_gemm", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_gemm"] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("gpu_gemm", None)


def test_no_gpu_exits_cleanly_with_the_reason(bench: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench, "probe_device", lambda target: "CuPy is not importable (test)")
    assert bench.main(["--sizes", "64"]) == 0
    assert bench.main(["--require-device"]) == 2
    out = capsys.readouterr().out
    assert out.count("no NVIDIA GPU here, nothing measured: CuPy is not importable (test)") == 2


def test_unknown_dtype_is_a_usage_error(bench: ModuleType) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--dtypes", "int8"])


def test_script_runs_as_a_program_without_a_gpu() -> None:
    if isinstance(core_device.probe_device("nvidia"), DeviceInfo):
        pytest.skip("this machine has an NVIDIA GPU; the benchmark would measure it")
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "no NVIDIA GPU here, nothing measured" in proc.stdout


def test_table_layout(bench: ModuleType) -> None:
    rows = [bench.Row("float16", 4096, 600.0, 330.0, 1.2e-3, "cublas_matmul"),
            bench.Row("float32", 1024, 40.0, None, None, "cublas_matmul", " (tie)")]
    text = bench.table(DeviceInfo("sm_90", "NVIDIA H200"), rows)
    lines = text.splitlines()
    assert lines[0] == "device: sm_90 (NVIDIA H200)"
    assert lines[3] == "| float16 | 4096 | 600.0 | 330.0 | 55% | 1.2e-03 | cublas_matmul |"
    assert lines[4] == "| float32 | 1024 | 40.0 | - | - | - | cublas_matmul (tie) |"


SANITIZE = SCRIPT.parents[1] / "ci" / "sanitize_emitted.py"


def test_sanitizer_driver_exits_2_with_the_reason_without_a_gpu() -> None:
    if isinstance(core_device.probe_device("nvidia"), DeviceInfo):
        pytest.skip("this machine has an NVIDIA GPU; the driver would run the kernels")
    proc = subprocess.run([sys.executable, str(SANITIZE)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the emitted lane cannot run here:" in proc.stdout
