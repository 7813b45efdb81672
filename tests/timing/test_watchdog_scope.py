"""A watch scope (one key's gates) installs the watchdog's handler once for all its
sessions, still cuts a hanging call short in any of them, and puts back the handler
and the timer it found; one CallWatch serves a gate's calls."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from types import FrameType

import numpy as np
import pytest

from pytest_arbiter import MeasureCache, measured_arbitrate
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.gate import GATE_SEED
from pytest_arbiter.core.ops import OPS
from pytest_arbiter.decision.gating import GateMemo
from pytest_arbiter.decision.states import DispatchKey
from pytest_arbiter.errors import CallTimeout
from pytest_arbiter.timing import watchdog as watchdog_module
from pytest_arbiter.timing.measure import ComparePolicy
from pytest_arbiter.timing.watchdog import CallWatch, watch_scope, watch_session, watchdog


@pytest.fixture
def installs(monkeypatch: pytest.MonkeyPatch, sigalrm_restored: None) -> Iterator[list[object]]:
    """Every handler the watchdog installs for SIGALRM."""
    seen: list[object] = []
    real = signal.signal

    def counting(signum: int, handler: object) -> object:
        if signum == signal.SIGALRM:
            seen.append(handler)
        return real(signum, handler)  # type: ignore[arg-type]

    monkeypatch.setattr(watchdog_module.signal, "signal", counting)
    yield seen


def test_the_sessions_of_a_scope_install_the_handler_once(installs: list[object]) -> None:
    before = signal.getsignal(signal.SIGALRM)
    with watch_scope():
        for _ in range(5):
            with watch_session(5.0), watchdog(5.0):
                pass
        with watch_session(5.0), pytest.raises(CallTimeout), watchdog(0.1):
            time.sleep(5)  # cut short in a later session too
    assert len(installs) == 2  # ours, then theirs back
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_scope_with_no_watchdog_asked_installs_nothing(installs: list[object]) -> None:
    with watch_scope():
        with watch_session(None):
            pass
    assert installs == []


def test_their_alarm_still_fires_in_a_scope(installs: list[object]) -> None:
    fired: list[float] = []

    def theirs(signum: int, frame: FrameType | None) -> None:
        fired.append(time.monotonic())

    signal.signal(signal.SIGALRM, theirs)
    signal.setitimer(signal.ITIMER_REAL, 0.15)
    start = time.monotonic()
    with watch_scope():
        with watch_session(5.0), watchdog(5.0):
            pass
        time.sleep(0.4)  # between the sessions: their alarm, through our handler
    assert len(fired) == 1 and fired[0] - start >= 0.14
    assert signal.getsignal(signal.SIGALRM) is theirs


def test_a_tune_installs_the_handler_once_for_its_gates_and_once_to_time(
        installs: list[object]) -> None:
    reg = CandidateRegistry()
    for i, fn in enumerate((np.matmul, np.dot, lambda a, b: a @ b)):
        reg.add(FunctionCandidate(fn, f"c{i}", "matmul", "cpu", 0, None, None))
    a = np.ones((8, 8), dtype="float32")
    memo = GateMemo(GATE_SEED, 5.0, lambda key: None)
    key = DispatchKey("cpu", "matmul", "8x8x8", "float32")
    measured_arbitrate("matmul", (a, a), reg.for_op("matmul"), MeasureCache(),
                       policy=ComparePolicy(min_rounds=3, max_rounds=5, budget_s=0.005,
                                            call_timeout_s=5.0),
                       verdict=lambda cand: memo.verdict(OPS.get("matmul"), key, cand, (a, a)))
    # the gates' handler in and out, the comparison's in and out: 4, not 2 per candidate
    assert len(installs) == 4, installs


def test_one_call_watch_serves_every_call_in_a_session_and_alone(
        installs: list[object]) -> None:
    watch = CallWatch(0.1)
    with watch_session(5.0):
        for _ in range(3):
            with watch:
                pass
        with pytest.raises(CallTimeout), watch:
            time.sleep(5)
        with watch:  # still usable after a cut
            pass
    assert len(installs) == 2  # the session's handler, in and out
    with pytest.raises(CallTimeout), watch:
        time.sleep(5)  # outside a session: a watchdog of its own
    assert len(installs) == 4
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
