"""A CUDA-event timer for ``measure_latency`` and measured arbitration.

Each sample records an event before and after the call on the current stream and
waits for the second, so it times the device work the call queued, not the launch.
With ``flush_l2`` a buffer twice the size of the L2 cache is cleared on the device
before each sample (outside the timed span), so every repetition starts from a cold
L2, as a kernel in a real pipeline usually does.

The first sample of each function is preceded by one untimed call, waited for: a
kernel's NVRTC compile, its module load and a library's first-call setup land there,
not in a timed span. Events and the flush buffer belong to one device, so the timer
keeps them per device, for whichever is current when it samples. The wait for the
stop event is polled (:func:`.faults.wait`), so the watchdog can stop a hung kernel.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_arbiter.runtime.cuda import faults
from pytest_arbiter.runtime.cuda.device import is_hip, load_cupy, on_reset

DEFAULT_L2_BYTES = 64 << 20  # when the driver does not say


@dataclass
class _DeviceState:
    """One device's events and flush buffer."""

    start: Any
    stop: Any
    scratch: Any


class CudaEventTimer:
    """Times one call in nanoseconds with CUDA (or HIP) events on the current stream."""

    def __init__(self, flush_l2: bool = True) -> None:
        self.flush_l2 = flush_l2
        self._devices: dict[int, _DeviceState] = {}
        self._warmed: weakref.WeakSet[Callable[[], object]] = weakref.WeakSet()
        self._warmed_ids: set[int] = set()  # functions that take no weak reference

    def _state(self, cp: Any) -> _DeviceState:
        device = int(cp.cuda.runtime.getDevice())
        found = self._devices.get(device)
        if found is None:
            scratch = cp.empty(flush_bytes(cp), dtype=cp.uint8) if self.flush_l2 else None
            found = _DeviceState(cp.cuda.Event(), cp.cuda.Event(), scratch)
            self._devices[device] = found
        return found

    def _first_call(self, fn: Callable[[], object]) -> bool:
        """Whether ``fn`` has not been sampled yet (and note that it now has)."""
        try:
            if fn in self._warmed:
                return False
            self._warmed.add(fn)
        except TypeError:
            if id(fn) in self._warmed_ids:
                return False
            self._warmed_ids.add(id(fn))
        return True

    def flush(self) -> None:
        """Overwrite the current device's scratch buffer, evicting whatever the L2 holds."""
        scratch = self._state(load_cupy()).scratch
        if scratch is not None:
            scratch.data.memset_async(0, scratch.nbytes)

    def sample(self, fn: Callable[[], object]) -> float:
        cp = load_cupy()
        target = "amd" if is_hip(cp) else "nvidia"
        with faults.device_work(target, "a call timed with CUDA events"):
            state = self._state(cp)
            if self._first_call(fn):
                fn()  # untimed: compile, module load, first-call library setup
                faults.wait_for_stream(cp)
            if state.scratch is not None:
                state.scratch.data.memset_async(0, state.scratch.nbytes)
            with faults.timed_span():
                state.start.record()
                fn()
                state.stop.record()
            faults.wait(state.stop)
            return float(cp.cuda.get_elapsed_time(state.start, state.stop)) * 1e6  # ms to ns


def flush_bytes(cp: Any) -> int:
    """Twice the current device's L2 size (at least 8 MiB)."""
    try:
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
        l2 = int(props.get("l2CacheSize", 0))
    except Exception:
        l2 = 0
    return max(2 * (l2 or DEFAULT_L2_BYTES), 8 << 20)


_SHARED: dict[str, CudaEventTimer] = {}
on_reset(_SHARED.clear)


def shared_timer() -> CudaEventTimer:
    """One flushing timer per process (its events and buffers per device), created on
    first use (CuPy is imported at its first sample)."""
    found = _SHARED.get("timer")
    if found is None:
        found = _SHARED.setdefault("timer", CudaEventTimer(flush_l2=True))
    return found
