"""Which timer measures a target's candidates."""

from __future__ import annotations

from pytest_arbiter.extend import hooks
from pytest_arbiter.extend.backends import BACKENDS
from pytest_arbiter.timing.measure import CPU_TIMER, Timer


def timer_for(target: str) -> Timer:
    """``target``'s timer: its backend's (CUDA events on the GPU lanes), else the CPU clock."""
    hooks.load_backends()
    backend = BACKENDS.for_target(target)
    return (backend.timer(target) if backend is not None else None) or CPU_TIMER
