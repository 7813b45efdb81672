"""The GPU lanes: CuPy candidates for the ``nvidia`` and ``amd`` targets.

* shipped: the library calls (cuBLAS / hipBLAS GEMM, CuPy softmax), ``shipped.py``;
* emitted: the bundled kernels in ``kernels/*.cu`` compiled with ``RawModule``,
  ``emitted.py`` (NVIDIA sm_80+ only).

Importing this package registers the device probes, CuPy's array target and the
CUDA-event timer; it never imports CuPy (the first device probe does).
"""

from __future__ import annotations

from pytest_arbiter.candidates import Candidate
from pytest_arbiter.runtime.cuda import device, emitted, shipped, timer

device.install()
timer.install()


def candidates() -> list[Candidate]:
    """Fresh instances of every GPU candidate, shipped lane first."""
    return [*shipped.candidates(), *emitted.candidates()]


__all__ = ["candidates"]
