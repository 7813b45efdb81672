"""The shipped lane: CuPy's own library calls (cuBLAS / hipBLAS GEMM, CuPy reductions)."""

from __future__ import annotations

from typing import Any

from pytest_arbiter.runtime.cuda.checks import (
    matmul_inputs_problem,
    softmax_inputs_problem,
)
from pytest_arbiter.runtime.cuda.lane import GpuCandidate

GEMM_DTYPES = ("float32", "float16", "bfloat16")
# CuPy's own CI skips bfloat16 matmul on ROCm (it crashed there), so hipBLAS is not
# offered bfloat16 until that is known to work
ROCM_GEMM_DTYPES = ("float32", "float16")
SOFTMAX_DTYPES = ("float32", "float16", "bfloat16")


class LibraryMatmul(GpuCandidate):
    """``cupy.matmul``: cuBLAS (or hipBLAS) GEMM, float32 accumulation for 16-bit inputs."""

    lane = "shipped"
    arity = 2
    needs = ("cublas",)

    def problem(self, *inputs: Any) -> str | None:
        return matmul_inputs_problem(inputs, self.dtypes)

    def launch(self, cp: Any, *inputs: Any) -> Any:
        a, b = inputs
        return cp.matmul(a, b)


class LibrarySoftmax(GpuCandidate):
    """Max-subtracted softmax from CuPy reductions and elementwise kernels (float32 math)."""

    lane = "shipped"

    def problem(self, *inputs: Any) -> str | None:
        return softmax_inputs_problem(inputs, self.dtypes)

    def launch(self, cp: Any, *inputs: Any) -> Any:
        (x,) = inputs
        work = x.astype(cp.float32) if x.dtype.itemsize == 2 else x
        e = cp.exp(work - work.max(axis=-1, keepdims=True))
        out = e / e.sum(axis=-1, keepdims=True)
        return out.astype(x.dtype, copy=False)


def candidates() -> list[GpuCandidate]:
    return [
        LibraryMatmul("cublas_matmul", "matmul", "nvidia", 2, GEMM_DTYPES),
        LibraryMatmul("hipblas_matmul", "matmul", "amd", 2, ROCM_GEMM_DTYPES),
        LibrarySoftmax("cupy_softmax", "softmax", "nvidia", 1, SOFTMAX_DTYPES),
        LibrarySoftmax("cupy_softmax_amd", "softmax", "amd", 1, SOFTMAX_DTYPES),
    ]
