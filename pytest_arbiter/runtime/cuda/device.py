"""The GPU behind the ``nvidia`` and ``amd`` targets, found through a lazily imported CuPy.

Nothing here imports CuPy at module import. The first device probe does, and any
failure (no CuPy, no driver, no device, a CuPy built for the other vendor) becomes a
reason string: the arbiter then records ``no_candidate`` for the target instead of
crashing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from pytest_arbiter.errors import GpuUnavailable
from pytest_arbiter.extend import device as core_device
from pytest_arbiter.extend.backends import DeviceInfo
from pytest_arbiter.runtime.cuda import install

EXTRAS_HINT = "install pytest-arbiter[cuda12], [cuda13] or [rocm]"
GPU_TARGETS = ("nvidia", "amd")


_LOCK = threading.Lock()
_CUPY: list[Any] = []  # [module] or [reason string] once the import has been tried


def _import_cupy() -> Any:
    import cupy

    return cupy


def _try_import() -> Any:
    """CuPy, or why not. Several CuPy distributions in one environment overwrite each
    other's files (CuPy warns at import, which ``filterwarnings = error`` turns into a
    failed import): that is found first, from the installed distributions."""
    duplicate = install.duplicate_reason(install.installed_cupy())
    if duplicate is not None:
        return duplicate
    try:
        return _import_cupy()
    except ImportError as exc:
        return f"CuPy is not importable ({exc}); {EXTRAS_HINT}"
    except Exception as exc:  # a broken install must not take the run down
        return f"CuPy failed to import: {type(exc).__name__}: {exc}"


def cupy_or_reason() -> Any:
    """The CuPy module, or a string saying why it cannot be used (tried once)."""
    if not _CUPY:
        with _LOCK:
            if not _CUPY:
                found = _try_import()
                if not isinstance(found, str):
                    _select_current_device(found)
                _CUPY.append(found)
    return _CUPY[0]


def _select_current_device(cp: Any) -> None:
    """Probe results per device: the core caches them by CuPy's current device."""
    def current() -> object:
        return int(cp.cuda.runtime.getDevice())

    for target in GPU_TARGETS:
        core_device.register_device_selector(target, current)


def load_cupy() -> Any:
    """The CuPy module; :class:`GpuUnavailable` with the reason when there is none."""
    found = cupy_or_reason()
    if isinstance(found, str):
        raise GpuUnavailable(found)
    return found


_RESETS: list[Callable[[], None]] = []


def on_reset(forget: Callable[[], None]) -> None:
    """Call ``forget`` on :func:`reset` (the lane's caches of what CuPy said)."""
    _RESETS.append(forget)


def reset() -> None:
    """Forget the import attempt and everything the lane learnt from CuPy: the toolkit
    checks, the timers, a lane marked unusable (tests swap CuPy in and out)."""
    with _LOCK:
        _CUPY.clear()
    for target in GPU_TARGETS:
        core_device.register_device_selector(target, None)
        core_device.reset_unusable(target)
    for forget in _RESETS:
        forget()


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").strip("\x00 ")
    return str(value or "").strip()


def is_hip(cp: Any) -> bool:
    """Whether ``cp`` is a ROCm (HIP) build of CuPy."""
    return bool(getattr(cp.cuda.runtime, "is_hip", False))


def describe_device(cp: Any, target: str) -> DeviceInfo | str:
    """The current device of ``cp`` for ``target``, or why there is none.

    NVIDIA: ``sm_<major><minor>`` from the compute capability (``sm_90``, ``sm_120``).
    AMD: the base of ``gcnArchName`` (``gfx1151:sramecc-:xnack-`` gives ``gfx1151``).
    """
    hip = is_hip(cp)
    if target == "nvidia" and hip:
        return "CuPy is a ROCm (HIP) build, so there is no NVIDIA device"
    if target == "amd" and not hip:
        return "CuPy is a CUDA build, so there is no AMD device (install pytest-arbiter[rocm])"
    runtime = cp.cuda.runtime
    try:
        count = int(runtime.getDeviceCount())
    except Exception as exc:
        kind = "ROCm" if hip else "CUDA"
        return f"no usable {kind} driver or device: {type(exc).__name__}: {exc}"
    if count < 1:
        return "the driver reports no GPU device"
    try:
        index = int(runtime.getDevice())
        props = runtime.getDeviceProperties(index)
    except Exception as exc:
        return f"cannot read the device properties: {type(exc).__name__}: {exc}"
    name = _text(props.get("name")) or "unknown GPU"
    if hip:
        arch = _text(props.get("gcnArchName")).split(":")[0]
        if not arch:
            return f"ROCm device {name!r} reports no gcnArchName"
        return DeviceInfo(arch, name, _uuid(props))
    return DeviceInfo(f"sm_{int(props['major'])}{int(props['minor'])}", name, _uuid(props))


def _uuid(props: Any) -> str:
    """The device's UUID as hex, else its PCI address, else ``""``."""
    uuid = props.get("uuid")
    if isinstance(uuid, bytes) and uuid.strip(b"\x00"):
        return uuid.hex()
    if uuid and not isinstance(uuid, bytes):
        return str(uuid)
    if "pciBusID" in props:
        return (f"pci-{int(props.get('pciDomainID', 0)):04x}:{int(props['pciBusID']):02x}:"
                f"{int(props.get('pciDeviceID', 0)):02x}")
    return ""


def probe(target: str) -> DeviceInfo | str:
    """Device probe for ``target`` (``nvidia`` or ``amd``)."""
    cp = cupy_or_reason()
    if isinstance(cp, str):
        return cp
    return describe_device(cp, target)


def compute_capability(tag: str) -> int | None:
    """``sm_90`` gives 90, ``sm_120`` gives 120; ``None`` for a tag that is not ``sm_*``."""
    if not tag.startswith("sm_") or not tag[3:].isdigit():
        return None
    return int(tag[3:])


TF32_VARIABLES = ("CUPY_TF32", "NVIDIA_TF32_OVERRIDE")
"""Environment variables that let float32 GEMMs run on TF32 tensor cores (CuPy's
``CUPY_TF32=1``) or forbid it (``NVIDIA_TF32_OVERRIDE=0``): they change both the
timings and the results, so the environment records them (``unset`` when unset)."""


def environment() -> list[tuple[str, str]]:
    """CuPy, the CUDA runtime CuPy was built against (``cuda_runtime``) and the one
    loaded here (``cuda_runtime_local``), the driver, NVRTC (which decides the machine
    code), the BLAS library and the TF32 switches."""
    cp = cupy_or_reason()
    if isinstance(cp, str):
        return []
    hip = is_hip(cp)
    runtime = "rocm_runtime" if hip else "cuda_runtime"
    found = [("cupy", str(getattr(cp, "__version__", "?")))]
    found += _read_each(((runtime, lambda: cp.cuda.runtime.runtimeGetVersion()),
                         (f"{runtime}_local", lambda: cp.cuda.get_local_runtime_version()),
                         ("driver", lambda: cp.cuda.runtime.driverGetVersion()),
                         ("nvrtc", lambda: ".".join(map(str, cp.cuda.nvrtc.getVersion()))),
                         ("blas_library", lambda: _blas_library(cp, hip))))
    found += [(name.lower(), os.environ.get(name, "unset")) for name in TF32_VARIABLES]
    return found


def _read_each(reads: Iterable[tuple[str, Callable[[], object]]]) -> list[tuple[str, str]]:
    """``(key, str(read()))`` for each read that works; one that raises is left out."""
    found = []
    for key, read in reads:
        try:
            found.append((key, str(read())))
        except Exception:
            pass
    return found


def _blas_library(cp: Any, hip: bool) -> str:
    handle = cp.cuda.device.get_cublas_handle()
    return f"{'hipblas' if hip else 'cublas'} {cp.cuda.cublas.getVersion(handle)}"
