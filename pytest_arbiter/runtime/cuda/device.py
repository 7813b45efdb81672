"""The GPU behind the ``nvidia`` and ``amd`` targets, found through a lazily imported CuPy.

Nothing here imports CuPy at module import. The first device probe does, and any
failure (no CuPy, no driver, no device, a CuPy built for the other vendor) becomes a
reason string: the arbiter then records ``no_candidate`` for the target instead of
crashing.
"""

from __future__ import annotations

import threading
from typing import Any

from pytest_arbiter.device import DeviceInfo

EXTRAS_HINT = "install pytest-arbiter[cuda12], [cuda13] or [rocm]"


class GpuUnavailable(RuntimeError):
    """Raised when a GPU candidate is run on a machine that cannot run it."""


_LOCK = threading.Lock()
_CUPY: list[Any] = []  # [module] or [reason string] once the import has been tried


def _import_cupy() -> Any:
    import cupy

    return cupy


def cupy_or_reason() -> Any:
    """The CuPy module, or a string saying why it cannot be used (tried once)."""
    if not _CUPY:
        with _LOCK:
            if not _CUPY:
                try:
                    found: Any = _import_cupy()
                except ImportError as exc:
                    found = f"CuPy is not importable ({exc}); {EXTRAS_HINT}"
                except Exception as exc:  # a broken install must not take the run down
                    found = f"CuPy failed to import: {type(exc).__name__}: {exc}"
                _CUPY.append(found)
    return _CUPY[0]


def load_cupy() -> Any:
    """The CuPy module; :class:`GpuUnavailable` with the reason when there is none."""
    found = cupy_or_reason()
    if isinstance(found, str):
        raise GpuUnavailable(found)
    return found


def reset() -> None:
    """Forget the import attempt (tests swap CuPy in and out)."""
    with _LOCK:
        _CUPY.clear()


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
        return DeviceInfo(arch, name)
    return DeviceInfo(f"sm_{int(props['major'])}{int(props['minor'])}", name)


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
