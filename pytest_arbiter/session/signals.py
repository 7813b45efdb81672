"""Cancellation that keeps what was measured.

``timeout``, CI cancellation and Kubernetes stop a run with SIGTERM (or SIGHUP when the
terminal goes), whose default action ends the process at once: a tuning run would lose
every measurement. :class:`CancelGuard` turns the first such signal into the
``KeyboardInterrupt`` pytest already handles for Ctrl-C (the session finishes, the
measured entries are written), and a second one into the default action: exit now.
Ctrl-C gets the same words. A pytest-xdist worker lets the first signal pass: one sent
to the whole process group reaches the controller too, which asks each worker to finish
its test (a worker torn down by it would be reported as crashed, its test as failed).
Nothing already written is lost either way (artifacts are written atomically). The same
signal again within :data:`ECHO_S` is the first one's echo, not a second: GNU ``timeout``
sends its signal to the command and then to the whole process group at once (Ctrl-C
pressed twice is two presses: no window for SIGINT).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP")
                if hasattr(signal, name))
ECHO_S = 1.0
"""How soon the same signal again is taken as the first one's echo (``timeout``'s signal
to the command, then to its process group), not a request to stop at once."""


class CancelGuard:
    """Handlers for :data:`SIGNALS`, installed where nothing else handles them."""

    def __init__(self, stop: Callable[[str], bool] | None = None,
                 say: Callable[[str], None] | None = None, worker: bool = False) -> None:
        self._previous: dict[int, Any] = {}
        self._stop = stop
        self._say = say or _stderr
        self._worker = worker
        self.received: list[str] = []
        """The names of the signals received, in order (an echo left out)."""
        self._first_at = 0.0

    @classmethod
    def install(cls, stop: Callable[[str], bool] | None = None,
                say: Callable[[str], None] | None = None, *,
                worker: bool = False) -> CancelGuard:
        """A guard over every signal still at its default action, Ctrl-C's included
        (main thread only). ``stop(why)`` may end the run its own way (an xdist
        controller asks its workers to finish, so their measurements come back): True
        when it did. ``say`` writes a line where the user sees it at once (default:
        stderr). ``worker``: an xdist worker's guard, which lets the first signal pass."""
        guard = cls(stop, say, worker)
        if threading.current_thread() is not threading.main_thread():
            return guard
        for signum in SIGNALS:
            if signal.getsignal(signum) is signal.SIG_DFL:
                guard._previous[signum] = signal.signal(signum, guard._handle)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            guard._previous[signal.SIGINT] = signal.signal(signal.SIGINT, guard._handle)
        return guard

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        __tracebackhide__ = True  # pytest shows the test's line that was interrupted
        name = signal.Signals(signum).name
        now = time.monotonic()
        if (self.received == [name] and signum != signal.SIGINT
                and now - self._first_at < ECHO_S):
            return  # the first one's echo (timeout signals the command, then its group)
        self.received.append(name)
        self._first_at = self._first_at or now
        if len(self.received) > 1:  # a second signal: the default action, now
            self.uninstall()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt(f"{name} received twice")
            signal.raise_signal(signum)
            return
        if self._worker:
            return  # the controller got it too, and asks this worker to finish
        self._say(f"pytest-arbiter: {name} received: finishing the run to keep what was "
                  "measured (send it again to stop at once)")
        if self._stop is not None and self._stop(f"{name} received"):
            return
        raise KeyboardInterrupt(f"{name} received")

    @property
    def why(self) -> str:
        """What stopped the run (``SIGTERM received``), empty if nothing did (a worker's:
        always, the controller says it)."""
        return f"{self.received[0]} received" if self.received and not self._worker else ""

    def uninstall(self) -> None:
        """Put the previous handlers back."""
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous)
        self._previous.clear()


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
