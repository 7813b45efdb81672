"""A per-call watchdog: a call that runs too long raises ``CallTimeout``.

pytest-timeout's signal method, scoped to one call: a real-time interval timer sends
SIGALRM and its handler raises in the main thread. The handler runs at the next
bytecode boundary, so a call waiting in Python code or in an interruptible wait
(``time.sleep``, most blocking I/O) is cut short, while a call stuck in C code that
never returns to the interpreter is reported only when it returns. Where the method
cannot be used (no SIGALRM, not the main thread, a SIGALRM handler already installed,
e.g. pytest-timeout's own) the watchdog does nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TypeVar

T = TypeVar("T")

# dispositions that leave SIGALRM free: nobody handles it in Python
_FREE: tuple[object, ...] = (signal.SIG_DFL, signal.SIG_IGN, None)


class CallTimeout(TimeoutError):
    """A call under :func:`watchdog` gave no result within ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no result after {seconds:g} s "
                         "(the per-call watchdog, --arbiter-call-timeout)")
        self.seconds = seconds


def watchdog_available() -> bool:
    """Whether the signal method can be used here: the platform has it, this is the
    main thread, and no other SIGALRM handler is installed."""
    return (hasattr(signal, "SIGALRM") and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGALRM) in _FREE)


# the limit of the call being watched, while the timer is armed (watchdogs never nest:
# an inner one finds the outer one's handler installed and does nothing)
_watching: list[float] = []


def _expire(signum: int, frame: FrameType | None) -> None:
    # a signal already on its way when the body finished must not raise
    if _watching:
        raise CallTimeout(_watching[0])


@contextlib.contextmanager
def _installed() -> Iterator[None]:
    """Our SIGALRM handler installed for the body; the previous handler and any running
    timer (paused meanwhile, resumed with what it had left) restored on exit."""
    left, interval = signal.setitimer(signal.ITIMER_REAL, 0)
    paused_at = time.monotonic() if left > 0 else 0.0
    previous = signal.signal(signal.SIGALRM, _expire)
    try:
        yield
    finally:
        # nested, so that an expiry between the body's end and the disarm (which
        # raises here) still restores the handler and the paused timer
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
            _watching.clear()
        finally:
            _watching.clear()  # again: the expiry may have raised before the line above
            # None: a handler installed outside Python, which cannot be reinstalled
            signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
            if left > 0:
                resume = max(left - (time.monotonic() - paused_at), 1e-6)
                signal.setitimer(signal.ITIMER_REAL, resume, interval)


@contextlib.contextmanager
def watchdog(seconds: float | None) -> Iterator[None]:
    """Raise ``CallTimeout`` in the body if it runs longer than ``seconds``.

    A no-op for ``None`` or a non-positive limit, and where the signal method cannot
    be used (see :func:`watchdog_available`). On exit the timer is disarmed and the
    previous SIGALRM handler restored; a timer that was already running is paused
    meanwhile and resumes with what it had left (at once if that ran out).
    """
    if seconds is None or seconds <= 0 or not watchdog_available():
        yield
        return
    with _installed():
        _watching.append(seconds)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        yield


def _unwatched(fn: Callable[[], T]) -> T:
    return fn()


@contextlib.contextmanager
def watched_calls(seconds: float | None) -> Iterator[Callable[[Callable[[], T]], T]]:
    """A runner that calls each function it is given under a ``seconds`` watchdog.

    For many short calls (the timed rounds): the handler is installed once for the
    body, and each call only arms and disarms the timer (about a microsecond, where
    installing the handler costs tens). Where the watchdog cannot be used, the runner
    just calls.
    """
    if seconds is None or seconds <= 0 or not watchdog_available():
        yield _unwatched
        return
    limit = seconds
    arm = signal.setitimer
    real = signal.ITIMER_REAL

    def watched(fn: Callable[[], T]) -> T:
        _watching.append(limit)
        arm(real, limit)
        try:
            return fn()
        finally:
            arm(real, 0)
            _watching.clear()

    with _installed():
        yield watched
