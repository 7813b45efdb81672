"""The GPU preflight: one RawKernel compile and launch, one library GEMM, before any
live test, so a runner that cannot compile or has no cuBLAS fails in one clear line
instead of in every gate.

Run it as ``python -m pytest_arbiter.runtime.cuda.preflight [nvidia|amd]``: it prints
one line and exits 0 when the lane works, 1 when it does not (2: no device at all).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from pytest_arbiter.extend.backends import DeviceInfo
from pytest_arbiter.extend.device import probe_device
from pytest_arbiter.runtime.cuda import faults, toolkit
from pytest_arbiter.runtime.cuda.device import load_cupy

KERNEL = r"""
extern "C" __global__ void arbiter_preflight(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f * x[i] + 1.0f;
}
"""


def _compile_and_launch(cp: Any) -> str | None:
    try:
        kernel = cp.RawKernel(KERNEL, "arbiter_preflight")
        x = cp.arange(64, dtype=cp.float32)
        kernel((1,), (64,), (x, np.int32(64)))
        faults.wait_for_stream(cp)
        got = np.asarray(x.get())
    except Exception as exc:
        return f"a RawKernel did not compile and run: {type(exc).__name__}: {exc}"
    if not np.array_equal(got, 2.0 * np.arange(64, dtype=np.float32) + 1.0):
        return "a RawKernel ran but computed wrong values"
    return None


def _library_gemm(cp: Any) -> str | None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(8, dtype=np.float32).reshape(4, 2)
    try:
        got = np.asarray(cp.matmul(cp.asarray(a), cp.asarray(b)).get())
    except Exception as exc:
        return f"the library GEMM (cupy.matmul) failed: {type(exc).__name__}: {exc}"
    if not np.allclose(got, a @ b):
        return "the library GEMM (cupy.matmul) computed wrong values"
    return None


def preflight(target: str = "nvidia") -> str | None:
    """``None`` when ``target``'s lane compiles and runs a kernel and a library GEMM on
    its device; else one line saying what fails and what to install."""
    found = probe_device(target)
    if not isinstance(found, DeviceInfo):
        return f"no {target} device: {found}"
    cp = load_cupy()
    needs = ("nvrtc", "cublas")
    problem = toolkit.toolkit_problem(cp, found, needs)
    if problem is None:
        try:
            with faults.device_work(target, "the preflight"):
                problem = _compile_and_launch(cp) or _library_gemm(cp)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
    if problem is None:
        return None
    return f"{found.tag} ({found.name}): {problem}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    target = args[0] if args else "nvidia"
    found = probe_device(target)
    problem = preflight(target)
    if problem is None:
        assert isinstance(found, DeviceInfo)
        print(f"GPU preflight passed on {found.tag} ({found.name}): a RawKernel compiled "
              "and ran, and the library GEMM ran")
        return 0
    print(f"GPU preflight failed: {problem}")
    return 1 if isinstance(found, DeviceInfo) else 2


if __name__ == "__main__":
    sys.exit(main())
