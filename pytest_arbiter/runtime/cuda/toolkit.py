"""The CUDA libraries behind CuPy: NVRTC (every compiled kernel, CuPy's own elementwise
kernels included) and cuBLAS (``cupy.matmul``), and whether NVRTC can build code this
device loads.

A CuPy wheel without ``[ctk]`` and without a local toolkit imports fine and finds the
device, then fails at the first compile or GEMM. These checks read library versions
only (no driver call) and turn that into an unavailable candidate with the reason.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from pytest_arbiter.extend.backends import DeviceInfo
from pytest_arbiter.runtime.cuda.device import compute_capability, is_hip, on_reset

CTK_HINT = ("install pytest-arbiter[cuda12] or [cuda13]: they bring cupy-cuda1Nx[ctk] "
            "(NVRTC, cuBLAS and the runtime as NVIDIA wheels), or install a CUDA toolkit")

TEGRA_ARCHS = (32, 53, 62, 72, 87)
"""Compute capabilities CuPy hands to NVRTC as they are, never capped."""

_LOCK = threading.Lock()
_FOUND: dict[str, Any] = {}


def _once(name: str, work: Any) -> Any:
    if name not in _FOUND:
        with _LOCK:
            if name not in _FOUND:
                _FOUND[name] = work()
    return _FOUND[name]


on_reset(_FOUND.clear)


def nvrtc_version(cp: Any) -> tuple[int, int] | str:
    """NVRTC's ``(major, minor)``, or why NVRTC cannot be loaded (no driver needed)."""

    def read() -> tuple[int, int] | str:
        try:
            major, minor = cp.cuda.nvrtc.getVersion()
            return int(major), int(minor)
        except Exception as exc:
            return f"NVRTC cannot be loaded ({type(exc).__name__}: {exc}); {CTK_HINT}"

    found: tuple[int, int] | str = _once("nvrtc", read)
    return found


def cublas_problem(cp: Any) -> str | None:
    """Why cuBLAS (hipBLAS on ROCm) cannot be loaded, or ``None``."""

    def read() -> str | None:
        try:
            _ = cp.cuda.cublas  # CuPy imports the library module on first access
        except Exception as exc:
            return f"cuBLAS cannot be loaded ({type(exc).__name__}: {exc}); {CTK_HINT}"
        return None

    found: str | None = _once("cublas", read)
    return found


def nvrtc_max_arch(version: tuple[int, int]) -> int:
    """The newest architecture CuPy 14 lets NVRTC ``version`` target
    (``cupy.cuda.compiler._get_max_compute_capability``)."""
    if version[0] == 12 and version[1] < 8:
        return 90
    if version == (12, 8):
        return 120
    return 121


def nvrtc_arch(cc: int, version: tuple[int, int]) -> int:
    """The architecture CuPy compiles for on a device of compute capability ``cc``."""
    return cc if cc in TEGRA_ARCHS else min(cc, nvrtc_max_arch(version))


def compiles_ptx() -> bool:
    """Whether CuPy is told to compile PTX (``CUPY_COMPILE_WITH_PTX=1``), which the driver
    then JIT-compiles, instead of a cubin."""
    value = os.environ.get("CUPY_COMPILE_WITH_PTX", "")
    try:
        return int(value) == 1
    except ValueError:
        return False


def arch_problem(tag: str, version: tuple[int, int], *, ptx: bool,
                 driver: int | None) -> str | None:
    """Why code NVRTC ``version`` builds for device ``tag`` would not load there, or
    ``None``. A cubin loads only on its own major architecture (an sm_90 cubin, what
    NVRTC 12.0-12.7 builds at most, never on sm_120); PTX only on a driver at least as
    new as the NVRTC that wrote it (``driver``: ``cudaDriverGetVersion``, e.g. 12080)."""
    cc = compute_capability(tag)
    if cc is None:
        return None
    built = nvrtc_arch(cc, version)
    nvrtc = f"NVRTC {version[0]}.{version[1]}"
    if not ptx and built // 10 != cc // 10:
        return (f"{nvrtc} builds for sm_{nvrtc_max_arch(version)} at most, and an "
                f"sm_{built} cubin cannot load on {tag}: install NVRTC 12.8 or newer "
                f"({CTK_HINT})")
    needed = version[0] * 1000 + version[1] * 10
    if ptx and driver is not None and driver < needed:
        return (f"CuPy compiles PTX (CUPY_COMPILE_WITH_PTX=1) with {nvrtc}, which a driver "
                f"for CUDA {driver // 1000}.{driver % 1000 // 10} cannot load: update the "
                "driver or unset CUPY_COMPILE_WITH_PTX")
    return None


def _driver_version(cp: Any) -> int | None:
    try:
        return int(cp.cuda.runtime.driverGetVersion())
    except Exception:
        return None


def toolkit_problem(cp: Any, device: DeviceInfo, needs: tuple[str, ...]) -> str | None:
    """Why the libraries in ``needs`` (``nvrtc``, ``cublas``) cannot serve ``device``
    through ``cp``, or ``None``. On ROCm only their loading is checked."""
    if "cublas" in needs:
        problem = cublas_problem(cp)
        if problem is not None:
            return problem
    if "nvrtc" not in needs:
        return None
    version = nvrtc_version(cp)
    if isinstance(version, str):
        return version
    if is_hip(cp):
        return None

    def check() -> str | None:
        return arch_problem(device.tag, version, ptx=compiles_ptx(),
                            driver=_driver_version(cp))

    found: str | None = _once(f"arch {device.tag} {device.uuid}", check)
    return found
