"""A CUDA-event timer for ``measure_latency`` and measured arbitration.

Each sample records an event before and after the call on the current stream and
waits for the second, so it times the device work the call queued, not the launch.
With ``flush_l2`` a buffer twice the size of the L2 cache is cleared on the device
before each sample (outside the timed span), so every repetition starts from a cold
L2, as a kernel in a real pipeline usually does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_arbiter.runtime.cuda.device import load_cupy

DEFAULT_L2_BYTES = 64 << 20  # when the driver does not say


class CudaEventTimer:
    """Times one call in nanoseconds with CUDA (or HIP) events on the current stream."""

    def __init__(self, flush_l2: bool = True) -> None:
        self.flush_l2 = flush_l2
        self._cp: Any = None
        self._events: tuple[Any, Any] | None = None
        self._scratch: Any = None

    def _setup(self) -> Any:
        cp = self._cp = load_cupy()
        self._events = (cp.cuda.Event(), cp.cuda.Event())
        if self.flush_l2:
            self._scratch = cp.empty(flush_bytes(cp), dtype=cp.uint8)
        return cp

    def flush(self) -> None:
        """Overwrite the scratch buffer on the device, evicting whatever the L2 holds."""
        scratch = self._scratch
        if scratch is not None:
            scratch.data.memset_async(0, scratch.nbytes)

    def sample(self, fn: Callable[[], object]) -> float:
        cp = self._cp if self._cp is not None else self._setup()
        assert self._events is not None
        start, stop = self._events
        if self.flush_l2:
            self.flush()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return float(cp.cuda.get_elapsed_time(start, stop)) * 1e6  # milliseconds to ns


def flush_bytes(cp: Any) -> int:
    """Twice the current device's L2 size (at least 8 MiB)."""
    try:
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
        l2 = int(props.get("l2CacheSize", 0))
    except Exception:
        l2 = 0
    return max(2 * (l2 or DEFAULT_L2_BYTES), 8 << 20)


_SHARED: dict[str, CudaEventTimer] = {}


def shared_timer() -> CudaEventTimer:
    """One flushing timer per process, created on first use (CuPy is imported then)."""
    found = _SHARED.get("timer")
    if found is None:
        found = _SHARED.setdefault("timer", CudaEventTimer(flush_l2=True))
    return found
