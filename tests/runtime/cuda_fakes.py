"""A fake CuPy for the GPU lane's host-free tests: devices, arrays, events, faults.

Enough of CuPy's surface for the lane's own code to run unchanged: the device probe,
``asarray``/``matmul``/``empty``, events (``done`` polls), NVRTC and cuBLAS loading, the
local runtime version. A fault (:meth:`FakeGpu.fault`) is sticky, as on a real device:
every later device call raises it; a hang keeps events from completing.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

H100 = {"name": b"NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "l2CacheSize": 50 << 20}
RTX5090 = {"name": b"NVIDIA GeForce RTX 5090", "major": 12, "minor": 0,
           "l2CacheSize": 96 << 20}
ILLEGAL_ADDRESS = 700


class CUDARuntimeError(RuntimeError):
    """Stands in for ``cupy_backends.cuda.api.runtime.CUDARuntimeError``."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


CUDARuntimeError.__module__ = "cupy_backends.cuda.api.runtime"


class FakeArray:
    """A device array: NumPy data behind CuPy's attributes; ``get()`` is a device call."""

    def __init__(self, gpu: FakeGpu, data: np.ndarray) -> None:
        self.gpu, self._data = gpu, np.ascontiguousarray(data)
        self.shape, self.dtype, self.ndim = self._data.shape, self._data.dtype, self._data.ndim
        self.size, self.strides = self._data.size, self._data.strides
        self.flags = SimpleNamespace(c_contiguous=True)
        self.data = SimpleNamespace(ptr=0x7F0000000000,
                                    memset_async=lambda value, size: gpu.call("flush"))

    def get(self) -> np.ndarray:
        self.gpu.call("copy to host")
        return self._data.copy()

    @property
    def nbytes(self) -> int:
        return int(self._data.nbytes)


FakeArray.__module__ = "cupy._core.core"


class FakeEvent:
    def __init__(self, gpu: FakeGpu, disable_timing: bool = False) -> None:
        self.gpu, self.device = gpu, gpu.current
        self.name = "wait" if disable_timing else f"timing event {len(gpu.events)}"
        gpu.events.append(self)

    def record(self) -> None:
        self.gpu.call(f"record {self.name} on device {self.gpu.current}")
        if self.device != self.gpu.current:
            raise CUDARuntimeError(400, "cudaErrorInvalidResourceHandle: event of another device")

    @property
    def done(self) -> bool:
        self.gpu.call(f"query {self.name}")
        return not self.gpu.hung

    def synchronize(self) -> None:
        self.gpu.call(f"blocking sync {self.name}")  # the watchdog cannot reach a real one


class FakeGpu:
    """The fake device state and the CuPy module built on it (:attr:`cp`)."""

    def __init__(self, *devices: dict[str, Any], nvrtc: tuple[int, int] | Exception = (13, 0),
                 cublas: Exception | None = None) -> None:
        self.devices = list(devices) or [H100]
        self.current = 0
        self.log: list[str] = []
        self.events: list[FakeEvent] = []
        self.sticky: CUDARuntimeError | None = None
        self.hung = False
        self.nvrtc = nvrtc
        self.cp = self._module(nvrtc, cublas)

    def call(self, what: str) -> None:
        """One device call: logged, and raising the sticky error once there is one."""
        self.log.append(what)
        if self.sticky is not None:
            raise self.sticky

    def fault(self) -> None:
        self.sticky = CUDARuntimeError(
            ILLEGAL_ADDRESS, "cudaErrorIllegalAddress: an illegal memory access was encountered")

    def _module(self, nvrtc: tuple[int, int] | Exception, cublas: Exception | None) -> Any:
        gpu = self

        def get_version() -> tuple[int, int]:
            if isinstance(nvrtc, Exception):
                raise nvrtc
            return nvrtc

        class Cuda:
            runtime = FakeRuntime(gpu)
            nvrtc = SimpleNamespace(getVersion=get_version)

            @staticmethod
            def Event(disable_timing: bool = False) -> FakeEvent:
                return FakeEvent(gpu, disable_timing)

            @staticmethod
            def get_elapsed_time(start: FakeEvent, stop: FakeEvent) -> float:
                return 1.5

            @staticmethod
            def get_local_runtime_version() -> int:
                return 13000

            @property
            def cublas(self) -> Any:
                if cublas is not None:
                    raise cublas
                return SimpleNamespace(getVersion=lambda handle: 130100)

            device = SimpleNamespace(get_cublas_handle=lambda: 1)

        def asarray(x: Any) -> FakeArray:
            gpu.call("copy to device")
            return x if isinstance(x, FakeArray) else FakeArray(gpu, np.asarray(x))

        def matmul(a: FakeArray, b: FakeArray) -> FakeArray:
            gpu.call("gemm")
            return FakeArray(gpu, a._data @ b._data)

        def empty(size: int, dtype: Any) -> FakeArray:
            gpu.call(f"alloc {size} on device {gpu.current}")
            return FakeArray(gpu, np.zeros(1, dtype=np.uint8))

        def raw_kernel(code: str, name: str) -> Any:
            gpu.compile(name)

            def launch(grid: Any, block: Any, args: tuple[Any, ...]) -> None:
                gpu.call(f"launch {name}")
                args[0]._data[:] = 2.0 * args[0]._data + 1.0  # the preflight's kernel

            return launch

        def arange(n: int, dtype: Any) -> FakeArray:
            return FakeArray(gpu, np.arange(n, dtype=dtype))

        return SimpleNamespace(
            __version__="14.2.0", cuda=Cuda(), asarray=asarray, ascontiguousarray=asarray,
            matmul=matmul, empty=empty, uint8=np.uint8, float32=np.float32,
            asnumpy=lambda x: x.get(), ndarray=FakeArray, RawKernel=raw_kernel, arange=arange)

    def compile(self, name: str) -> None:
        """NVRTC compiling ``name``: fails as CuPy does when NVRTC cannot be loaded."""
        self.call(f"compile {name}")
        if isinstance(self.nvrtc, Exception):
            raise self.nvrtc


class FakeRuntime:
    is_hip = False

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu

    def getDeviceCount(self) -> int:
        return len(self.gpu.devices)

    def getDevice(self) -> int:
        return self.gpu.current

    def getDeviceProperties(self, index: int) -> dict[str, Any]:
        props = dict(self.gpu.devices[index])
        props.setdefault("uuid", bytes([index + 1]) * 16)
        return props

    def runtimeGetVersion(self) -> int:
        return 13010

    def driverGetVersion(self) -> int:
        return 13000
