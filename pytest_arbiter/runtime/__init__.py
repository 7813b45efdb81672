"""The bundled runtime: CPU candidates always, GPU candidates behind lazy CuPy imports.

Importing this package registers the bundled candidates; it never imports pytest or CuPy.
"""

from __future__ import annotations

from pytest_arbiter.candidates import REGISTRY, CandidateRegistry
from pytest_arbiter.runtime import cpu


def register_bundled(registry: CandidateRegistry = REGISTRY) -> None:
    """Add the bundled candidates to ``registry``."""
    registry.extend(cpu.candidates())
    try:
        from pytest_arbiter.runtime import cuda
    except ImportError:  # the CUDA lane is optional
        return
    registry.extend(cuda.candidates())


register_bundled()
