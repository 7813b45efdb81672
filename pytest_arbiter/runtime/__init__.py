"""The bundled runtime: the CPU lane always, the CUDA/ROCm lane behind lazy CuPy imports.

This module is the bundled lanes' plugin: :func:`pytest_arbiter.extend.hooks.load_backends`
registers it with the arbiter's plugin manager on first need. Importing it registers
nothing; it never imports pytest or CuPy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_arbiter.extend.hookspecs import hookimpl

if TYPE_CHECKING:
    from pytest_arbiter.core.candidates import CandidateRegistry
    from pytest_arbiter.extend.backends import Backend


def bundled_backends() -> list[Backend]:
    """Fresh instances of the bundled lanes: the CPU, and CUDA/ROCm."""
    from pytest_arbiter.runtime.backends import CpuBackend, CudaBackend

    return [CpuBackend(), CudaBackend()]


@hookimpl(trylast=True)
def pytest_arbiter_add_backends() -> list[Backend]:
    return bundled_backends()


def register_bundled(registry: CandidateRegistry) -> None:
    """Add the bundled candidates to ``registry`` (a fresh one, in tests and benchmarks)."""
    for backend in bundled_backends():
        registry.extend(backend.candidates())
