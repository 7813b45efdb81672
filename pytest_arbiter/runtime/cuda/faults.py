"""Device faults kept where they happen: waits the watchdog can cut short, and sticky
CUDA errors that end the lane for the rest of the process.

A kernel launch returns before the kernel runs, so a fault (an illegal address) shows
at the next synchronising call, which may belong to the next candidate; and a blocking
synchronise sits in C, where the watchdog's signal cannot reach it. So a GPU candidate
waits for its own work by polling an event from Python (:func:`wait`), and an error
that leaves the context unusable (:data:`STICKY`) marks the target unusable through
:func:`pytest_arbiter.extend.device.mark_unusable`: later probes give the reason, and the
arbiter records ``no_candidate`` instead of blaming the next candidate.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from pytest_arbiter.errors import CallTimeout, GpuLaneLost
from pytest_arbiter.extend import device as core_device

STICKY = frozenset({
    226,  # cudaErrorContained
    700,  # cudaErrorIllegalAddress
    702,  # cudaErrorLaunchTimeout
    710,  # cudaErrorAssert
    714,  # cudaErrorHardwareStackError
    715,  # cudaErrorIllegalInstruction
    716,  # cudaErrorMisalignedAddress
    717,  # cudaErrorInvalidAddressSpace
    718,  # cudaErrorInvalidPc
    719,  # cudaErrorLaunchFailure
    721,  # cudaErrorTensorMemoryLeak
    810,  # cudaErrorMpsClientTerminated
    911,  # cudaErrorExternalDevice
})
"""CUDA runtime and driver status codes (same numbers in both, and in HIP's) documented
as leaving the process in an inconsistent state: any further CUDA work fails."""

_SPIN_S = 50e-6
_MAX_SLEEP_S = 1e-3


def sticky_status(exc: BaseException) -> int | None:
    """The status of a CuPy CUDA/HIP error that poisons the context, else ``None``."""
    status = getattr(exc, "status", None)
    module = type(exc).__module__.partition(".")[0]
    if module in ("cupy", "cupy_backends") and isinstance(status, int) and status in STICKY:
        return status
    return None


def lost_reason(target: str) -> str | None:
    """Why ``target``'s lane was lost in this process, or ``None``."""
    return core_device.unusable_reason(target)


def check_usable(target: str) -> None:
    """Raise :class:`GpuLaneLost` when ``target``'s lane was lost (nothing is sent)."""
    reason = lost_reason(target)
    if reason is not None:
        raise GpuLaneLost(target, reason)


@contextlib.contextmanager
def device_work(target: str, what: str) -> Iterator[None]:
    """Around device work for ``what`` (a candidate's name): a sticky CUDA error, or the
    watchdog stopping a wait while the device still runs, marks ``target``'s lane
    unusable and is raised as :class:`GpuLaneLost` (the watchdog's ``CallTimeout``
    itself goes on up)."""
    check_usable(target)
    try:
        yield
    except CallTimeout as stop:
        core_device.mark_unusable(target, (
            f"the {target} lane is unusable for the rest of this process: {what}'s device "
            f"work was still running when the watchdog stopped it ({stop})"))
        raise
    except Exception as exc:
        status = sticky_status(exc)
        if status is None:
            raise
        reason = (f"the {target} lane is unusable for the rest of this process: {what} "
                  f"hit a sticky CUDA error ({type(exc).__name__}: {exc}), which leaves "
                  f"the context unusable")
        core_device.mark_unusable(target, reason)
        raise GpuLaneLost(target, reason) from exc


def wait(event: Any) -> None:
    """Wait until ``event`` has completed, polling from Python so a watchdog's signal
    can interrupt the wait; a device fault raises here, from CuPy's event query."""
    if event.done:
        return
    start = time.perf_counter()
    pause = 0.0
    while not event.done:
        if time.perf_counter() - start < _SPIN_S:
            continue
        pause = min(_MAX_SLEEP_S, pause * 2 or 10e-6)
        time.sleep(pause)


def wait_for_stream(cp: Any) -> None:
    """Wait for the work queued so far on the current stream (see :func:`wait`)."""
    event = cp.cuda.Event(disable_timing=True)
    event.record()
    wait(event)


_TIMING = threading.local()


@contextlib.contextmanager
def timed_span() -> Iterator[None]:
    """While the event timer times a call: a candidate then leaves the waiting to the
    timer's stop event, so no host round trip lands inside the timed span."""
    _TIMING.active = True
    try:
        yield
    finally:
        _TIMING.active = False


def in_timed_span() -> bool:
    return bool(getattr(_TIMING, "active", False))
