"""The GPU lanes: CuPy candidates for the ``nvidia`` and ``amd`` targets.

* shipped: the library calls (cuBLAS / hipBLAS GEMM, CuPy softmax), ``shipped.py``;
* emitted: the bundled kernels in ``kernels/*.cu`` compiled with ``RawModule``,
  ``emitted.py`` (NVIDIA sm_80+ only);
* the device probe (``device.py``) and the CUDA-event timer (``timer.py``), which
  ``pytest_arbiter/runtime/backends.py`` serves as the lane's backend.

Importing this package registers nothing and imports neither NumPy nor CuPy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_arbiter.core.candidates import Candidate


def candidates() -> list[Candidate]:
    """Fresh instances of every GPU candidate, shipped lane first."""
    from pytest_arbiter.runtime.cuda import emitted, shipped

    return [*shipped.candidates(), *emitted.candidates()]


__all__ = ["candidates"]
