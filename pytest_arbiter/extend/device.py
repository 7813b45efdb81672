"""Device tags: the exact device a target's timings were measured on.

Timings are only comparable on the same device, so the tag carries what changes them:
for the CPU the architecture and CPU model; for GPUs the architecture (``sm_90``,
``gfx1151``). Each target's device comes from its backend (:mod:`pytest_arbiter.extend.backends`).
"""

from __future__ import annotations

import functools
import numbers
import platform
import re
import threading
from collections.abc import Callable, Sequence

from pytest_arbiter.extend.backends import BACKENDS, DeviceInfo
from pytest_arbiter.extend.hooks import load_backends

_UNSAFE = re.compile(r"[^a-z0-9]+")




def _slug(text: str) -> str:
    return _UNSAFE.sub("-", text.lower()).strip("-")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown-cpu"


@functools.lru_cache(maxsize=1)
def cpu_device() -> DeviceInfo:
    """The CPU's device tag, e.g. ``cpu-x86_64-intel-r-xeon-r-processor``."""
    model = _cpu_model()
    machine = platform.machine() or "unknown"
    return DeviceInfo(f"cpu-{machine.lower()}-{_slug(model)}", model)


_RESOLVED: dict[tuple[str, object], DeviceInfo | str] = {}
_UNUSABLE: dict[str, str] = {}
_SELECTORS: dict[str, Callable[[], object]] = {}
_GENERATION = [0]
_LOCK = threading.Lock()


def register_device_selector(target: str, current: Callable[[], object] | None) -> None:
    """Say which of ``target``'s devices is current (``current()``: a device index, a
    hashable), so probe results are cached per device, not per target: a process that
    switches GPUs gets the tag of the one it now uses. ``None`` removes it."""
    with _LOCK:
        if current is None:
            _SELECTORS.pop(target, None)
        else:
            _SELECTORS[target] = current


def _drop(target: str | None) -> None:
    for key in [k for k in _RESOLVED if target is None or k[0] == target]:
        del _RESOLVED[key]
    _GENERATION[0] += 1


def forget(target: str | None = None) -> None:
    """Drop cached probe results (all targets, or one), e.g. after changing devices.
    A lane marked unusable stays so (:func:`mark_unusable`)."""
    with _LOCK:
        _drop(target)


def mark_unusable(target: str, reason: str) -> None:
    """``target``'s device lane cannot be used again in this process (a sticky CUDA
    error poisoned its context, a kernel still runs past the watchdog): from now on
    :func:`probe_device` returns ``reason`` for it, so nothing more is sent there and
    the arbiter records ``no_candidate`` with the reason. The first reason stays."""
    with _LOCK:
        _UNUSABLE.setdefault(target, reason)
        _GENERATION[0] += 1


def unusable_reason(target: str) -> str | None:
    """Why ``target``'s lane was marked unusable in this process, or ``None``."""
    return _UNUSABLE.get(target)


def reset_unusable(target: str | None = None) -> None:
    """Forget :func:`mark_unusable` (tests; a real poisoned context stays poisoned)."""
    with _LOCK:
        for name in [t for t in _UNUSABLE if target is None or t == target]:
            del _UNUSABLE[name]
        _GENERATION[0] += 1


def probe_generation() -> int:
    """A counter that moves whenever a probe result may have changed (:func:`forget`,
    :func:`mark_unusable`): a plan built from an older probe should be built again."""
    return _GENERATION[0]


def _probe(target: str) -> DeviceInfo | str:
    load_backends()
    backend = BACKENDS.for_target(target)
    if backend is None:
        return f"no backend serves target {target!r}"
    return backend.probe(target)


def _current(target: str) -> object:
    """Which of ``target``'s devices is current (``None``: the target has one, or its
    selector cannot say)."""
    select = _SELECTORS.get(target)
    if select is None:
        return None
    try:
        return select()
    except Exception:  # a poisoned or lost context: probe again, and say why
        return _PROBE_AGAIN


_PROBE_AGAIN = object()  # never a cache key that was stored: forces a fresh probe


def probe_device(target: str) -> DeviceInfo | str:
    """The device for ``target``, or a string saying why there is none. Cached per
    target and current device; a lane marked unusable gives its reason."""
    lost = _UNUSABLE.get(target)
    if lost is not None:
        return lost
    found = _RESOLVED.get((target, _current(target)))
    if found is not None:
        return found
    try:
        found = _probe(target)
    except Exception as exc:  # a broken driver must not take the dispatch down
        found = f"device probe for {target!r} failed: {type(exc).__name__}: {exc}"
    current = _current(target)  # the probe may have just loaded the selector's library
    with _LOCK:
        if current is not _PROBE_AGAIN:
            _RESOLVED[(target, current)] = found
    return found


def device_tag(target: str) -> str | None:
    """The device tag for ``target``, or ``None`` when this machine has no such device."""
    found = probe_device(target)
    return found.tag if isinstance(found, DeviceInfo) else None


def lock_identity(tag: str) -> str:
    """What the measurement lock of device ``tag`` is keyed by: the tag and the UUID of
    the current device of a probed target with that tag, where its backend gave one
    (eight H100s under xdist time in parallel, one per GPU); else the tag alone.
    Probes nothing."""
    for (target, current), found in list(_RESOLVED.items()):
        if (isinstance(found, DeviceInfo) and found.tag == tag and found.uuid
                and target not in _UNUSABLE and _current(target) == current):
            return f"{tag}-{found.uuid}"
    return tag


def target_of_array(x: object) -> str:
    """The target an input array lives on: ``cpu`` for NumPy; the backends add theirs."""
    module = type(x).__module__.partition(".")[0]
    backend = BACKENDS.for_array_module(module)
    if backend is None:
        load_backends()
        backend = BACKENDS.for_array_module(module)
    if backend is None:
        known = ", ".join(BACKENDS.array_modules())
        raise ValueError(f"cannot tell which target a {type(x).__module__}.{type(x).__name__} "
                         f"lives on (known array packages: {known}); pass target=")
    return backend.array_target(x)


def target_of_inputs(inputs: Sequence[object]) -> str:
    """The target a dispatch's inputs live on: the first array's; numbers (an ``int``,
    an ``IntEnum`` axis, a ``Fraction``, a NumPy scalar), strings and ``None`` live
    nowhere, and inputs that are all such values run on ``cpu``. Anything else (a list
    of arrays, an array of an unknown package) is asked for ``target=``."""
    for x in inputs:
        if not isinstance(x, (numbers.Number, str, bytes, type(None))):
            return target_of_array(x)
    return "cpu"


VISIBLE_DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
_WORKER_ID = re.compile(r"gw(\d+)")


def worker_device_environment(worker_id: str, devices: Sequence[str]) -> dict[str, str]:
    """The environment that pins pytest-xdist worker ``worker_id`` to one of ``devices``.

    Worker ``gwN`` gets ``devices[N % len(devices)]`` through the variables the CUDA and
    ROCm runtimes read when they start, so it must be applied before the first GPU call.
    """
    found = _WORKER_ID.fullmatch(worker_id)
    if found is None:
        raise ValueError(f"xdist worker id {worker_id!r} is not of the form gwN")
    if not devices:
        raise ValueError("no devices to assign to xdist workers")
    for device in devices:
        if not device or "," in device or device != device.strip():
            raise ValueError(f"device {device!r} in the worker device list is not one index "
                             "or UUID (write them comma-separated, e.g. 0,1,2,3)")
    chosen = devices[int(found.group(1)) % len(devices)]
    return dict.fromkeys(VISIBLE_DEVICE_VARIABLES, chosen)
