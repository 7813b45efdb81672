"""A watched_calls session (one per F4 gate, one per comparison) keeps a timer that was
running before it (pytest-timeout's) on time between its calls, not only during them."""

from __future__ import annotations

import signal
import time
from types import FrameType

from pytest_arbiter.timing.watchdog import watched_calls


def test_their_alarm_fires_at_its_time_between_the_calls_of_a_session(
        sigalrm_restored: None) -> None:
    fired: list[float] = []

    def theirs(signum: int, frame: FrameType | None) -> None:
        fired.append(time.monotonic())

    signal.signal(signal.SIGALRM, theirs)
    start = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    with watched_calls(5.0) as run:
        assert run(lambda: 7) == 7
        while not fired and time.monotonic() < start + 3.0:
            time.sleep(0.01)  # the gate's own work between two kernel calls
        assert fired, "their alarm waited for the session's end"
        assert run(lambda: 8) == 8
    time.sleep(0.05)
    assert len(fired) == 1 and fired[0] - start < 1.5
    assert signal.getsignal(signal.SIGALRM) is theirs
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0.0
