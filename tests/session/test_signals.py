"""The cancel guard's rule for a signal again: GNU ``timeout``'s echo of its SIGTERM (to
the command, then at once to its group) is not a second signal, while Ctrl-C pressed
twice is two presses (the second stops at once). The handler is called directly: no
signal is sent to the test process."""

from __future__ import annotations

import signal

import pytest

from pytest_arbiter.session.signals import CancelGuard


def test_the_same_sigterm_at_once_is_an_echo_and_a_second_ctrl_c_stops() -> None:
    said: list[str] = []
    guard = CancelGuard(stop=lambda why: True, say=said.append)
    guard._handle(signal.SIGTERM, None)
    guard._handle(signal.SIGTERM, None)  # timeout's signal to the group, just after
    assert guard.received == ["SIGTERM"] and len(said) == 1

    presses = CancelGuard(stop=lambda why: False, say=said.append)
    with pytest.raises(KeyboardInterrupt, match=r"SIGINT received$"):
        presses._handle(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt, match="received twice"):
        presses._handle(signal.SIGINT, None)
    assert presses.received == ["SIGINT", "SIGINT"]
