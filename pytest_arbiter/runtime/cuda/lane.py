"""The base of every GPU candidate: availability from the device probe, checks first.

``run`` takes NumPy or CuPy arrays. It checks the inputs before it imports CuPy or
touches the device; host inputs are copied to the device and the result is copied
back, device inputs stay there. ``prepare_inputs`` does the copy once, so the F4 gate
and the timer see the kernel alone. ``run`` returns after its device work is done
(polled, so the watchdog can stop a hang), except inside the event timer's span; a
sticky CUDA error ends the lane for the process (:mod:`.faults`).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.dtypes import dtype_name, numpy_dtype
from pytest_arbiter.extend.backends import DeviceInfo
from pytest_arbiter.extend.device import probe_device
from pytest_arbiter.runtime.cuda import faults, toolkit
from pytest_arbiter.runtime.cuda.device import cupy_or_reason, load_cupy

_BF16_LOCK = threading.Lock()
_BF16: list[str | None] = []


def bfloat16_problem() -> str | None:
    """Why this CuPy cannot hold bfloat16 arrays (CuPy < 14), or ``None`` when it can."""
    if not _BF16:
        with _BF16_LOCK:
            if not _BF16:
                cp = cupy_or_reason()
                verdict: str | None
                if isinstance(cp, str):
                    verdict = cp
                else:
                    try:
                        cp.zeros(1, dtype=numpy_dtype("bfloat16"))
                        verdict = None
                    except Exception as exc:
                        verdict = (f"this CuPy ({getattr(cp, '__version__', '?')}) has no "
                                   f"bfloat16 arrays (CuPy >= 14 with ml_dtypes has): "
                                   f"{type(exc).__name__}: {exc}")
                _BF16.append(verdict)
    return _BF16[0]


def reset_bfloat16_probe() -> None:
    with _BF16_LOCK:
        _BF16.clear()


class GpuCandidate(Candidate):
    """A candidate that runs on the current CuPy device of its target."""

    lane = ""  # "shipped" (a library call) or "emitted" (a bundled kernel)
    arity = 1
    needs: tuple[str, ...] = ("nvrtc",)
    """The CUDA libraries it calls: ``nvrtc`` (compiled kernels, CuPy's elementwise and
    reduction kernels too), ``cublas``."""

    def __init__(self, name: str, op: str, target: str, tier: int,
                 dtypes: tuple[str, ...]) -> None:
        super().__init__(name, op, target, tier)
        self.dtypes = dtypes

    # -- what subclasses define ---------------------------------------------------------

    def problem(self, *inputs: Any) -> str | None:
        """Why these inputs are invalid or unsupported (shape, dtype, layout), or ``None``."""
        raise NotImplementedError

    def device_problem(self, device: DeviceInfo) -> str | None:
        """Why this candidate cannot run on ``device`` although CuPy found it: a library
        in :attr:`needs` missing, or NVRTC unable to build code the device loads."""
        cp = cupy_or_reason()
        if isinstance(cp, str):
            return cp
        return toolkit.toolkit_problem(cp, device, self.needs)

    def launch(self, cp: Any, *inputs: Any) -> Any:
        """Run on device arrays that passed :meth:`problem`; return a device array."""
        raise NotImplementedError

    # -- the Candidate protocol ---------------------------------------------------------

    def unavailable_reason(self) -> str | None:
        found = probe_device(self.target)
        if isinstance(found, str):
            return found
        return self.device_problem(found)

    def accepts(self, *inputs: Any) -> bool:
        try:
            if self.problem(*inputs) is not None:
                return False
            return not self._needs_bfloat16(inputs) or bfloat16_problem() is None
        except Exception:
            return False

    def check(self, *inputs: Any) -> None:
        """Raise ``ValueError`` for inputs this kernel must not touch; no side effects."""
        problem = self.problem(*inputs)
        if problem is not None:
            raise ValueError(f"{self.name}: {problem}")

    def prepare_inputs(self, *inputs: Any) -> tuple[Any, ...]:
        self.check(*inputs)
        cp = load_cupy()
        with faults.device_work(self.target, self.name):
            return tuple(cp.ascontiguousarray(cp.asarray(x)) for x in inputs)

    def run(self, *inputs: Any) -> Any:
        self.check(*inputs)
        cp = load_cupy()
        with faults.device_work(self.target, self.name):
            on_host = isinstance(inputs[0], np.ndarray)
            device_inputs = [cp.asarray(x) for x in inputs] if on_host else list(inputs)
            out = self.launch(cp, *device_inputs)
            if not faults.in_timed_span():
                faults.wait_for_stream(cp)
            return cp.asnumpy(out) if on_host else out

    @staticmethod
    def _needs_bfloat16(inputs: tuple[Any, ...]) -> bool:
        return bool(inputs) and hasattr(inputs[0], "dtype") and dtype_name(
            inputs[0].dtype) == "bfloat16"
