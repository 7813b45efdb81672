"""Which timer measures a target's candidates."""

from __future__ import annotations

from collections.abc import Callable

from pytest_arbiter.extend import hooks
from pytest_arbiter.extend.backends import BACKENDS
from pytest_arbiter.timing.measure import CPU_TIMER, Timer


def register_timer(target: str, make_timer: Callable[[], Timer]) -> None:
    """Set the timer used to measure ``target``'s candidates, over its backend's (the
    older way; :meth:`pytest_arbiter.Backend.timer` is the current one)."""
    BACKENDS.timer_overrides[target] = make_timer


def timer_for(target: str) -> Timer:
    """``target``'s timer: its backend's (CUDA events on the GPU lanes), else the CPU clock."""
    make = BACKENDS.timer_overrides.get(target)
    if make is not None:
        return make()
    hooks.load_backends()
    backend = BACKENDS.for_target(target)
    return (backend.timer(target) if backend is not None else None) or CPU_TIMER
