"""CPU candidates: NumPy/BLAS kernels that genuinely compete.

* ``blas_matmul``: ``np.matmul`` (the gufunc path into BLAS); 16-bit types are upcast
  to float32, multiplied and rounded back.
* ``dot_matmul``: ``np.dot``, which calls BLAS GEMM/GEMV directly with less dispatch
  overhead: faster for small and skinny products.
* ``panel_matmul``: blocks K into panels of 256, converting one panel at a time into a
  float32 accumulator, so 16-bit inputs are never upcast whole; it declines K that is
  not a multiple of the panel (an alignment-restricted kernel, like the origin case).
* ``stable_softmax``: the textbook max-subtracted softmax with temporaries.
* ``inplace_softmax``: the same arithmetic in one preallocated buffer (``out=``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pytest_arbiter.core.candidates import Candidate, FunctionCandidate
from pytest_arbiter.core.dtypes import compute_dtype

PANEL = 256


def _host_pair(a: Any, b: Any) -> bool:
    return isinstance(a, np.ndarray) and isinstance(b, np.ndarray)


def _host_one(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def blas_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.itemsize == 2:
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    return np.matmul(a, b)


def dot_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.itemsize == 2:
        return np.dot(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    out: np.ndarray = np.dot(a, b)
    return out


def panel_accepts(a: Any, b: Any) -> bool:
    return _host_pair(a, b) and a.shape[1] >= PANEL and a.shape[1] % PANEL == 0


def panel_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    k = a.shape[1]
    if k % PANEL:
        raise ValueError(f"panel_matmul needs K % {PANEL} == 0, got K={k}")
    acc_dtype = compute_dtype(a.dtype)
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=acc_dtype)
    for start in range(0, k, PANEL):
        stop = start + PANEL
        acc += np.matmul(a[:, start:stop].astype(acc_dtype, copy=False),
                         b[start:stop].astype(acc_dtype, copy=False))
    return acc.astype(a.dtype, copy=False)


def stable_softmax(x: np.ndarray) -> np.ndarray:
    work = x.astype(compute_dtype(x.dtype))
    shifted = work - work.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)


def inplace_softmax(x: np.ndarray) -> np.ndarray:
    buf = x.astype(compute_dtype(x.dtype))
    np.subtract(buf, buf.max(axis=-1, keepdims=True), out=buf)
    np.exp(buf, out=buf)
    np.divide(buf, buf.sum(axis=-1, keepdims=True), out=buf)
    return buf.astype(x.dtype, copy=False)


def candidates() -> list[Candidate]:
    pair, one = _host_pair, _host_one
    return [
        FunctionCandidate(blas_matmul, "blas_matmul", "matmul", "cpu", 1, pair, None),
        FunctionCandidate(dot_matmul, "dot_matmul", "matmul", "cpu", 0, pair, None),
        FunctionCandidate(panel_matmul, "panel_matmul", "matmul", "cpu", 0, panel_accepts,
                          None, align=(1, 1, PANEL)),
        FunctionCandidate(stable_softmax, "stable_softmax", "softmax", "cpu", 0, one, None),
        FunctionCandidate(inplace_softmax, "inplace_softmax", "softmax", "cpu", 1, one, None),
    ]

