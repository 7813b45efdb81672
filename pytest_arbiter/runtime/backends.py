"""The bundled lanes as backends: the host CPU, and CUDA/ROCm through CuPy.

Nothing here imports NumPy, the kernels or CuPy: a device probe or a timer lookup
costs no kernel import; :meth:`candidates` imports the kernels, and the first GPU probe
imports CuPy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_arbiter.extend.backends import Backend, DeviceInfo
from pytest_arbiter.extend.device import cpu_device
from pytest_arbiter.runtime.cuda import device as gpu, timer as gpu_timer

if TYPE_CHECKING:
    from pytest_arbiter.core.candidates import Candidate
    from pytest_arbiter.timing.measure import Timer


class CpuBackend(Backend):
    """The host CPU: NumPy arrays, the monotonic clock, the kernels of ``runtime/cpu.py``."""

    name = "cpu"
    targets = ("cpu",)
    array_modules = ("numpy",)
    fallback = True

    def probe(self, target: str) -> DeviceInfo | str:
        return cpu_device()

    def candidates(self) -> list[Candidate]:
        from pytest_arbiter.runtime import cpu

        return cpu.candidates()


class CudaBackend(Backend):
    """CuPy's current device for ``nvidia`` and ``amd``; CUDA-event timing; the shipped
    and emitted candidates of ``runtime/cuda/``."""

    name = "cuda"
    targets = ("nvidia", "amd")
    array_modules = ("cupy",)
    fallback = True

    def probe(self, target: str) -> DeviceInfo | str:
        return gpu.probe(target)

    def timer(self, target: str) -> Timer | None:
        return gpu_timer.shared_timer()

    def array_target(self, array: object) -> str:
        # an array from CuPy exists, so CuPy has been imported already
        return "amd" if gpu.is_hip(gpu.load_cupy()) else "nvidia"

    def candidates(self) -> list[Candidate]:
        from pytest_arbiter.runtime import cuda

        return cuda.candidates()

    def environment(self, target: str) -> list[tuple[str, str]]:
        return gpu.environment()
