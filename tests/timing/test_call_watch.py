"""One CallWatch serves a gate's calls; and each gate installs the watchdog's handler
for itself, so what one candidate does to SIGALRM (stopping the timer, installing a
handler of its own) never lets a later candidate of the key run unwatched."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

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
from pytest_arbiter.timing.watchdog import CallWatch, watch_session


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


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A kernel's own SIGALRM handler, left installed."""


def stops_the_alarm(a: Any, b: Any) -> Any:
    out = np.matmul(a, b)
    signal.setitimer(signal.ITIMER_REAL, 0)
    return out


def takes_the_alarm(a: Any, b: Any) -> Any:
    out = np.matmul(a, b)
    signal.signal(signal.SIGALRM, _ignore)
    return out


def hangs(a: Any, b: Any) -> Any:
    time.sleep(3.0)
    return np.matmul(a, b)


@pytest.mark.parametrize("tidy", [stops_the_alarm, takes_the_alarm])
def test_what_one_candidate_does_to_the_alarm_frees_no_later_one(
        tidy: Any, sigalrm_restored: None) -> None:
    """A candidate that stops the timer, or leaves a SIGALRM handler of its own, before a
    hanging candidate of the same key: the hanging one is still cut at its limit."""
    reg = CandidateRegistry()
    reg.add(FunctionCandidate(tidy, "a_tidy", "matmul", "cpu", 0, None, None))
    reg.add(FunctionCandidate(hangs, "z_hangs", "matmul", "cpu", 0, None, None))
    a = np.ones((8, 8), dtype="float32")
    memo = GateMemo(GATE_SEED, 0.3, lambda key: None)
    key = DispatchKey("cpu", "matmul", "8x8x8", "float32")
    start = time.monotonic()
    sel = measured_arbitrate(
        "matmul", (a, a), reg.for_op("matmul"), MeasureCache(),
        policy=ComparePolicy(min_rounds=3, max_rounds=5, budget_s=0.005, call_timeout_s=0.3),
        verdict=lambda cand: memo.verdict(OPS.get("matmul"), key, cand, (a, a)))
    assert time.monotonic() - start < 10.0  # unwatched, its trials take 3 s each
    outcome, reason = sel.found["z_hangs"]
    assert outcome == "error" and "CallTimeout: no result after 0.3 s" in reason
    assert sel.candidate is not None and sel.candidate.name == "a_tidy"
