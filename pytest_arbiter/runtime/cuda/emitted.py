"""The emitted lane: the bundled CUDA C kernels, compiled at run time with CuPy's RawModule.

Each source is compiled once per device (NVRTC for that device's architecture, CuPy's
kernel cache on disk behind it). The kernels use inline PTX (``mma.sync``, ``cp.async``,
``ldmatrix``, ``cvt``), so this lane is NVIDIA-only and needs sm_80 or newer.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from pytest_arbiter.extend.backends import DeviceInfo
from pytest_arbiter.runtime.cuda import sources
from pytest_arbiter.runtime.cuda.checks import (
    device_pointer,
    matmul_inputs_problem,
    softmax_inputs_problem,
)
from pytest_arbiter.runtime.cuda.device import compute_capability, cupy_or_reason, is_hip
from pytest_arbiter.runtime.cuda.lane import GpuCandidate
from pytest_arbiter.runtime.cuda.sources import KernelSource

_LOCK = threading.Lock()
_MODULES: dict[tuple[int, str], Any] = {}
_FUNCTIONS: dict[tuple[int, str], Any] = {}


def kernel(cp: Any, source: KernelSource, function: str, *, dynamic_shared: int = 0) -> Any:
    """``function`` from ``source``, compiled for the current device on first use.

    ``dynamic_shared`` above the default 48 KiB is opted into once per function.
    """
    device = int(cp.cuda.runtime.getDevice())
    found = _FUNCTIONS.get((device, function))
    if found is not None:
        return found
    with _LOCK:
        module = _MODULES.get((device, source.file))
        if module is None:
            module = cp.RawModule(code=source.text(), options=source.options())
            _MODULES[(device, source.file)] = module
        found = module.get_function(function)
        if dynamic_shared > 48 * 1024:
            found.max_dynamic_shared_size_bytes = dynamic_shared
        _FUNCTIONS[(device, function)] = found
    return found


def compiled_modules() -> list[tuple[int, str]]:
    """(device id, source file) of every module compiled so far in this process."""
    return sorted(_MODULES)


class EmittedCandidate(GpuCandidate):
    """A bundled kernel; unavailable on ROCm and below sm_80, with the reason."""

    lane = "emitted"
    kernel_source: KernelSource
    """The ``.cu`` file the kernel is compiled from."""

    def fingerprint_parts(self) -> tuple[str, ...]:
        """What the kernel's code is beyond its Python class: the ``.cu`` source text and
        the compile options (:func:`pytest_arbiter.extend.fingerprint.fingerprint_of`)."""
        source = self.kernel_source
        return (source.file, source.text(), *source.options())

    def device_problem(self, device: DeviceInfo) -> str | None:
        cp = cupy_or_reason()
        if not isinstance(cp, str) and is_hip(cp):
            return ("the emitted kernels are NVIDIA-only (inline PTX: mma.sync, cp.async, "
                    "ldmatrix); this CuPy is a ROCm build")
        cc = compute_capability(device.tag)
        if cc is None or cc < sources.MIN_COMPUTE_CAPABILITY:
            return (f"the emitted kernels need sm_{sources.MIN_COMPUTE_CAPABILITY} or newer, "
                    f"this device is {device.tag} ({device.name})")
        return super().device_problem(device)


class TiledSgemm(EmittedCandidate):
    """Shared-memory tiled SGEMM (128x128x8 tiles, 8x8 per thread); any shape, float32."""

    arity = 2
    kernel_source = sources.SGEMM

    def problem(self, *inputs: Any) -> str | None:
        return matmul_inputs_problem(inputs, self.dtypes)

    def launch(self, cp: Any, *inputs: Any) -> Any:
        a, b = inputs
        m, k = a.shape
        n = b.shape[1]
        out = cp.zeros((m, n), dtype=a.dtype) if k == 0 else cp.empty((m, n), dtype=a.dtype)
        if m == 0 or n == 0 or k == 0:
            return out
        bm, bn, _ = sources.SGEMM_TILE
        fn = kernel(cp, sources.SGEMM, "tiled_sgemm")
        fn(((n + bn - 1) // bn, (m + bm - 1) // bm), (sources.SGEMM_THREADS,),
           (a, b, out, np.int32(m), np.int32(n), np.int32(k)))
        return out


class MmaMatmul(EmittedCandidate):
    """Tensor-core GEMM (mma.sync m16n8k16, float32 accumulate) for float16 / bfloat16.

    Declines (``accepts`` is False) unless M % 16 == 0, N % 8 == 0, K % 32 == 0 (the K
    tile), the operands are C-contiguous and device operands are 16-byte aligned.
    """

    arity = 2
    kernel_source = sources.MMA_GEMM
    align_m, align_n, align_k = 16, 8, sources.MMA_TILE[2]
    align = (align_m, align_n, align_k)  # what the registry reports to the cache key

    def problem(self, *inputs: Any) -> str | None:
        found = matmul_inputs_problem(inputs, self.dtypes)
        if found is not None:
            return found
        a, b = inputs
        m, k = a.shape
        n = b.shape[1]
        if m % self.align_m or n % self.align_n or k % self.align_k:
            return (f"shape not aligned to the tensor-core tiling: needs M % {self.align_m}, "
                    f"N % {self.align_n}, K % {self.align_k} == 0, got M={m}, N={n}, K={k}")
        for what, x in (("A", a), ("B", b)):
            ptr = device_pointer(x)
            if ptr is not None and ptr % 16:
                return f"{what} is not 16-byte aligned on the device (pointer {ptr:#x})"
        return None

    def launch(self, cp: Any, *inputs: Any) -> Any:
        a, b = inputs
        m, k = a.shape
        n = b.shape[1]
        out = cp.empty((m, n), dtype=a.dtype)
        if m == 0 or n == 0:
            return out
        bm, bn, _ = sources.MMA_TILE
        name = "mma_gemm_f16" if a.dtype == np.float16 else "mma_gemm_bf16"
        smem = sources.mma_shared_bytes()
        fn = kernel(cp, sources.MMA_GEMM, name, dynamic_shared=smem)
        fn(((n + bn - 1) // bn, (m + bm - 1) // bm), (sources.MMA_THREADS,),
           (a, b, out, np.int32(m), np.int32(n), np.int32(k)), shared_mem=smem)
        return out


SOFTMAX_FUNCTIONS = {"float32": "fused_softmax_f32", "float16": "fused_softmax_f16",
                     "bfloat16": "fused_softmax_bf16"}


def softmax_threads(n: int) -> int:
    """Threads per row: a power of two from 32 to 1024, about eight elements each."""
    threads = 32
    while threads < 1024 and threads * 8 < n:
        threads *= 2
    return threads


class FusedSoftmax(EmittedCandidate):
    """One block per row: max, sum of exp and the normalised write in one launch."""

    kernel_source = sources.SOFTMAX

    def problem(self, *inputs: Any) -> str | None:
        found = softmax_inputs_problem(inputs, self.dtypes)
        if found is not None:
            return found
        n = inputs[0].shape[-1]
        if n >= 2**31 or inputs[0].size // n >= 2**31:
            return f"{inputs[0].shape} does not fit the kernel's 32-bit row count and length"
        return None

    def launch(self, cp: Any, *inputs: Any) -> Any:
        (x,) = inputs
        out = cp.empty_like(x)
        n = int(x.shape[-1])
        rows = int(x.size) // n
        if rows == 0:
            return out
        dtype = "bfloat16" if x.dtype.name == "bfloat16" else str(x.dtype)
        fn = kernel(cp, sources.SOFTMAX, SOFTMAX_FUNCTIONS[dtype])
        fn((rows,), (softmax_threads(n),), (x, out, np.int32(n)))
        return out


GEMM_DTYPES_TC = ("float16", "bfloat16")


def candidates() -> list[GpuCandidate]:
    return [
        TiledSgemm("tiled_sgemm", "matmul", "nvidia", 0, ("float32",)),
        MmaMatmul("mma_matmul", "matmul", "nvidia", 1, GEMM_DTYPES_TC),
        FusedSoftmax("fused_softmax", "softmax", "nvidia", 2,
                     ("float32", "float16", "bfloat16")),
    ]
