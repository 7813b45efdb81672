"""A per-call watchdog: a call that runs too long raises ``CallTimeout``.

pytest-timeout's signal method, scoped to one call: a real-time interval timer sends
SIGALRM and its handler raises in the main thread. The handler runs at the next
bytecode boundary, so a call waiting in Python code or in an interruptible wait
(``time.sleep``, most blocking I/O) is cut short, while a call stuck in C code that
never returns to the interpreter is reported only when it returns. Where the method
cannot be used (no SIGALRM, not the main thread) the watchdog does nothing. Another
SIGALRM handler (pytest-timeout's signal method) is chained: its alarm is still
delivered at its time, and ours fires only for the call we watch.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from types import FrameType, TracebackType
from typing import Any, TypeVar

from pytest_arbiter.errors import CallTimeout

A = TypeVar("A")
T = TypeVar("T")

def watchdog_available() -> bool:
    """Whether the signal method can be used here: the platform has it, this is the
    main thread, and no watchdog of ours is already running (another SIGALRM handler,
    pytest-timeout's say, is chained: it still fires at its own time)."""
    return (hasattr(signal, "SIGALRM") and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGALRM) is not _expire)


class _Watch:
    """While our handler is installed: the watched call's limit and deadline, and the
    handler and alarm time of whoever had SIGALRM before us."""

    limit: float | None = None
    deadline = 0.0
    session = False
    """A :func:`watch_session` holds the handler: a :func:`watchdog` in it only arms."""
    previous: Any = None
    theirs_at: float | None = None
    ticking = False
    """The timer is set to fire at or before the running call's deadline (and their
    alarm): a call of a session then sets its deadline without a system call."""


_watch = _Watch()


def _expire(signum: int, frame: FrameType | None) -> None:
    _watch.ticking = False
    now = time.monotonic()
    if _watch.limit is not None and now >= _watch.deadline - 1e-4:
        limit, _watch.limit = _watch.limit, None
        _tick(now)  # their alarm, if one is pending, keeps its time
        raise CallTimeout(limit)
    previous = _watch.previous
    if _watch.theirs_at is not None and now >= _watch.theirs_at - 1e-4:
        _watch.theirs_at = None
        if callable(previous):
            previous(signum, frame)  # their alarm, at their time (pytest-timeout's)
    # early for the running call (the timer was set for an earlier call's deadline), or
    # between calls: set it again for what is still to come
    _tick(time.monotonic())


def _tick(now: float) -> None:
    """Set the timer for the running call's deadline or their alarm, whichever is first
    (nothing to wait for: leave it stopped)."""
    waits = [t - now for t in ((_watch.deadline if _watch.limit is not None else None),
                               _watch.theirs_at) if t is not None]
    if waits:
        signal.setitimer(signal.ITIMER_REAL, max(min(waits), 1e-6))
        _watch.ticking = True


def _start_call(limit: float) -> None:
    """A call of a session starts: its deadline, and the timer only if none is set (one
    set for an earlier call fires first, and :func:`_expire` sets it again)."""
    now = time.monotonic()
    _watch.limit, _watch.deadline = limit, now + limit
    if not _watch.ticking:
        _tick(now)


def _end_call() -> None:
    """A call of a session ended: no deadline; the timer is left to run out."""
    _watch.limit = None


def _arm(limit: float) -> None:
    """Arm the timer for a call of ``limit`` seconds, or for their alarm if sooner."""
    now = time.monotonic()
    _watch.limit, _watch.deadline = limit, now + limit
    wait = limit
    if _watch.theirs_at is not None:
        wait = min(wait, max(_watch.theirs_at - now, 1e-6))
    signal.setitimer(signal.ITIMER_REAL, wait)
    _watch.ticking = True


def _disarm() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)
    _watch.limit = None
    _watch.ticking = False


@contextlib.contextmanager
def _installed() -> Iterator[None]:
    """Our SIGALRM handler installed for the body; the previous handler and any running
    timer (its alarm still delivered at its time, through us) restored on exit."""
    left, interval = signal.setitimer(signal.ITIMER_REAL, 0)
    _watch.theirs_at = time.monotonic() + left if left > 0 else None
    _watch.previous = signal.signal(signal.SIGALRM, _expire)
    previous = _watch.previous
    _tick(time.monotonic())  # their alarm, at its time, before any call of ours too
    try:
        yield
    finally:
        # nested, so that an expiry between the body's end and the disarm (which
        # raises here) still restores the handler and the paused timer
        try:
            _disarm()
        finally:
            _watch.limit = None
            theirs_at, _watch.theirs_at, _watch.previous = _watch.theirs_at, None, None
            # None: a handler installed outside Python, which cannot be reinstalled
            signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
            if theirs_at is not None:
                resume = max(theirs_at - time.monotonic(), 1e-6)
                signal.setitimer(signal.ITIMER_REAL, resume, interval)


def watchdog(seconds: float | None) -> AbstractContextManager[None]:
    """Raise ``CallTimeout`` in the body if it runs longer than ``seconds``.

    A no-op for ``None`` or a non-positive limit, and where the signal method cannot
    be used (see :func:`watchdog_available`). On exit the timer is disarmed and the
    previous SIGALRM handler restored; a timer that was already running is paused
    meanwhile and resumes with what it had left (at once if that ran out). In a
    :func:`watch_session`, between its calls, only the timer is armed and stopped.
    """
    return _CallWatch(seconds)


class _CallWatch:
    """What :func:`watchdog` returns: a plain context manager rather than a generator's,
    as the F4 gate enters one for every trial call (a third of the cost of one)."""

    __slots__ = ("_installed", "_seconds", "_started")

    def __init__(self, seconds: float | None) -> None:
        self._seconds = seconds
        self._started = False
        """A call of a :func:`watch_session` started: its end only clears the deadline."""
        self._installed: AbstractContextManager[None] | None = None
        """Our handler installed for this call alone, restored on exit."""

    def __enter__(self) -> None:
        seconds = self._seconds
        if seconds is None or seconds <= 0:
            return
        if _watch.session and _watch.limit is None \
                and threading.current_thread() is threading.main_thread():
            _start_call(seconds)
            self._started = True
            return
        if not watchdog_available():
            return
        installed = _installed()
        installed.__enter__()
        self._installed = installed
        try:
            _arm(seconds)
        except BaseException as exc:
            self._installed = None
            installed.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if self._started:
            self._started = False
            _end_call()
        elif self._installed is not None:
            installed, self._installed = self._installed, None
            return bool(installed.__exit__(kind, exc, tb))
        return False


class CallWatch:
    """One watchdog for many calls, one after the other (the F4 gate's trial calls):
    entered for each call, the same object each time. In a :func:`watch_session` on the
    main thread a call only sets its deadline, with no object made; elsewhere each call
    gets a :func:`watchdog` of its own."""

    __slots__ = ("_alone", "_seconds", "_started")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._started = False
        self._alone: _CallWatch | None = None

    def __enter__(self) -> None:
        if _watch.session and _watch.limit is None \
                and threading.current_thread() is threading.main_thread():
            seconds = self._seconds
            now = time.monotonic()
            _watch.limit, _watch.deadline = seconds, now + seconds
            if not _watch.ticking:
                _tick(now)
            self._started = True
            return
        alone = _CallWatch(self._seconds)
        alone.__enter__()
        self._alone = alone

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if self._started:
            self._started = False
            _watch.limit = None
            return False
        alone, self._alone = self._alone, None
        return alone is not None and alone.__exit__(kind, exc, tb)


@contextlib.contextmanager
def watch_session(seconds: float | None) -> Iterator[None]:
    """Our handler installed once for the body, so that each :func:`watchdog` in it only
    sets its deadline (no system call while the timer set for an earlier call is still
    to fire; the handler sets it again when it fires early): the F4 gate's trials, one
    session per gate. A no-op where no watchdog is
    asked for or it cannot be used; a timer that was running (pytest-timeout's) keeps
    its time, between the calls too."""
    if seconds is None or seconds <= 0 or not watchdog_available():
        yield
        return
    with _installed():
        _watch.session = True
        try:
            yield
        finally:
            _watch.session = False


def _unwatched(fn: Callable[[A], T], arg: A) -> T:
    return fn(arg)


@contextlib.contextmanager
def watched_calls(seconds: float | None) -> Iterator[Callable[[Callable[[A], T], A], T]]:
    """A runner that calls ``fn(arg)`` for each ``(fn, arg)`` it is given under a
    ``seconds`` watchdog (the argument spares a timing loop a closure per call).

    For many short calls (the timed rounds): the handler is installed once for the
    body, and each call only sets its deadline; the timer is set once, and again only
    when it fires before the running call's deadline (so a comparison of short calls
    makes a system call or two, not two per call). A timer that was running
    (pytest-timeout's) keeps its time between the calls. Where the watchdog cannot be
    used, the runner just calls.
    """
    if seconds is None or seconds <= 0 or not watchdog_available():
        yield _unwatched
        return
    limit, watch, monotonic = seconds, _watch, time.monotonic

    def watched(fn: Callable[[A], T], arg: A) -> T:
        # _start_call and _end_call inlined: this runs once per timed call
        now = monotonic()
        watch.limit, watch.deadline = limit, now + limit
        if not watch.ticking:
            _tick(now)
        try:
            return fn(arg)
        finally:
            watch.limit = None

    with _installed():
        yield watched
