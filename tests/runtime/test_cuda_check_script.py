"""Issue 30, point 5: the GPU check finishes and keeps its output.

``bench/gpu_gemm.py`` gates at a small region and prints each row as it is measured;
the offline check covers every runtime dependency, the build backend and CuPy; other
CuPy distributions are removed before an install, and found by the probe when not.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from pytest_arbiter import DeviceInfo
from pytest_arbiter.runtime.cuda import device as cuda_device, install
from tests.factories import ROOT

CHECK = (ROOT / "ci" / "gpu-check.sh").read_text(encoding="utf-8")


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("gpu_gemm", ROOT / "bench" / "gpu_gemm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_gemm"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("gpu_gemm", None)


def test_rows_are_printed_as_they_are_measured(bench: ModuleType,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench, "probe_device", lambda target: DeviceInfo("sm_90", "H100"))
    done: list[int] = []

    def measure(size: int, dtype: str, repeat: int) -> Any:
        if done:
            raise KeyboardInterrupt  # what a step's timeout looks like from inside
        done.append(size)
        return bench.Row(dtype, size, 600.0, 300.0, 1e-3, "cublas_matmul")

    monkeypatch.setattr(bench, "measure", measure)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--sizes", "1024,2048", "--dtypes", "float16"])
    out = capsys.readouterr().out
    assert "| float16 | 1024 | 600.0 | 300.0 | 50% | 1.0e-03 | cublas_matmul |" in out


def test_the_benchmark_gates_at_a_small_region(bench: ModuleType,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def gate(cand: Any, op: Any, **kw: Any) -> Any:
        seen.append(kw["region"].describe())
        raise RuntimeError("stop")

    monkeypatch.setattr(bench, "f4_gate", gate)
    with pytest.raises(RuntimeError):
        bench.small_gate(bench.cuda.candidates()[0], "float16")
    assert seen and "m=256, n=256, k=256" in seen[0]


def test_the_offline_check_covers_every_runtime_dependency() -> None:
    tomllib = pytest.importorskip("tomllib")
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)
    assert list(install.RUNTIME_REQUIREMENTS) == project["project"]["dependencies"]
    assert list(install.BUILD_REQUIREMENTS) == project["build-system"]["requires"]
    assert "install.py\" offline" in CHECK or '"$INSTALL" offline' in CHECK


def test_the_offline_check_names_what_is_missing() -> None:
    have = {"numpy": "2.4.6", "ml_dtypes": "0.5.0", "pytest": "8.3.0", "pluggy": "1.5.0",
            "filelock": "3.16.0", "hypothesis": "6.100.0", "cupy-cuda12x": "14.0.1",
            "setuptools": "65.5.0"}
    problems = install.offline_problems(have.get)
    assert problems == ["junitparser is not installed", "msgspec is not installed",
                        "setuptools 65.5.0 is older than 77"]


def test_other_cupy_distributions_are_removed_before_an_install() -> None:
    assert install.conflicts("cupy-cuda13x", {"cupy-cuda12x": "14.0", "cupy-cuda13x": "14.2"}
                             ) == ["cupy-cuda12x"]
    removal = CHECK.index('pip uninstall -q -y $others')
    assert CHECK.index('"$INSTALL" conflicts "$extra"') < removal
    assert removal < CHECK.index('pip install -q -e ".[test,$extra]"')


def test_the_preflight_runs_before_any_test_and_the_benchmark_keeps_going() -> None:
    assert CHECK.index("-m pytest_arbiter.runtime.cuda.preflight") < CHECK.index(
        "tests/runtime/test_cuda_host.py")
    assert '|| failed+=("GEMM benchmark' in CHECK
    assert '|| failed+=("live gates' in CHECK


def test_every_test_file_the_check_runs_exists() -> None:
    named = re.findall(r"tests/[\w/]+\.py", CHECK)
    assert "tests/runtime/test_cuda_live.py" in named
    assert [name for name in named if not (ROOT / name).is_file()] == []


def test_two_cupy_distributions_are_a_reason_not_a_warning(
        cupy_as: Callable[[Any], None], monkeypatch: pytest.MonkeyPatch) -> None:
    def warns() -> Any:
        import warnings

        warnings.warn("CuPy may not function correctly because multiple CuPy packages "
                      "are installed", UserWarning, stacklevel=1)
        raise AssertionError("unreachable under filterwarnings = error")

    cupy_as(ImportError("replaced below"))
    monkeypatch.setattr(cuda_device, "_import_cupy", warns)
    versions = {"cupy-cuda12x": "14.0.1", "cupy-cuda13x": "14.2.0"}
    monkeypatch.setattr(install, "installed_version", versions.get)
    reason = cuda_device.cupy_or_reason()
    assert isinstance(reason, str)
    assert reason.startswith("several CuPy distributions are installed (cupy-cuda12x, "
                             "cupy-cuda13x)")
    assert "pip uninstall -y cupy-cuda12x cupy-cuda13x" in reason
