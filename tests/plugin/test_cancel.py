"""Cancellation keeps what was measured: SIGTERM (what ``timeout``, CI cancellation and
Kubernetes send) or SIGHUP during ``pytest --arbiter-tune`` finishes the run and writes
the measured entries, with or without pytest-xdist, to the controller or to the whole
process group; a second signal stops at once and leaves no damaged file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not hasattr(signal, "SIGTERM") or sys.platform == "win32",
                                 reason="POSIX signals")]

CONFTEST = '''
import time

import pytest_arbiter

pytest_arbiter.op("cx_twice", reference=lambda x: x * 2.0)


@pytest_arbiter.candidate("cx_twice", target="cpu", name="cx_quick")
def quick(x):
    return x * 2.0


@pytest_arbiter.candidate("cx_twice", target="cpu", name="cx_slow")
def slow(x):
    time.sleep(0.0003)
    return x * 2.0
'''

TESTS = '''
import pathlib
import time

import numpy as np
import pytest
import pytest_arbiter


@pytest.mark.parametrize("n", range(40))
def test_key(n):
    # one key per test: its own power-of-two size
    pytest_arbiter.dispatch("cx_twice", np.ones((n + 1, 2 ** (n % 8))))
    pathlib.Path(f"done-{n}").touch()
    time.sleep(0.25)
'''


def start(path: Path, *args: str, under: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    (path / "conftest.py").write_text(CONFTEST)
    (path / "test_keys.py").write_text(TESTS)
    return subprocess.Popen(
        [*under, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--arbiter-tune",
         "--arbiter-cache=c.json", *args],
        cwd=path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=_default_signals)


def _default_signals() -> None:
    """The run's signals at their default action, however this test was started (under
    ``nohup`` SIGHUP is ignored, and a guard leaves an ignored signal alone)."""
    for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)


def wait_for(path: Path, done: int, proc: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        found = len(list(path.glob("done-*")))
        if found >= done:
            return found
        time.sleep(0.05)
    raise AssertionError(f"the run never measured {done} keys: {proc.communicate()[0]}")


def entries(path: Path) -> int:
    return len(json.loads((path / "c.json").read_text())["entries"])


SIGNAL = {"sighup": signal.SIGHUP, "ctrl-c": signal.SIGINT, "group-ctrl-c": signal.SIGINT}


@pytest.mark.parametrize("how", [
    pytest.param("process", id="sigterm"),
    pytest.param("sighup", id="sighup"),
    pytest.param("ctrl-c", id="ctrl-c"),
    pytest.param("controller", id="xdist-controller", marks=pytest.mark.xdist),
    pytest.param("group", id="xdist-group", marks=pytest.mark.xdist),
    pytest.param("group-ctrl-c", id="xdist-group-ctrl-c", marks=pytest.mark.xdist),
    pytest.param("timeout", id="xdist-timeout", marks=pytest.mark.xdist),
])
def test_a_cancelled_tune_keeps_what_it_measured(tmp_path: Path, how: str) -> None:
    """Also under xdist with the signal sent to the whole process group (a terminal's
    Ctrl-C, CI's cancellation), or to the controller and at once to the group (what GNU
    ``timeout`` does): the workers finish their tests, none is reported as crashed or
    failed."""
    xdist = how in ("controller", "group", "group-ctrl-c", "timeout")
    if xdist:
        pytest.importorskip("xdist")
    # GNU timeout passes the SIGTERM it gets to the command and then to its group
    under = ("timeout", "--preserve-status", "600") if how == "timeout" else ()
    if under and shutil.which("timeout") is None:
        pytest.skip("no GNU timeout here")
    proc = start(tmp_path, *(["-n", "2"] if xdist else []), under=under)
    measured = wait_for(tmp_path, 4, proc)
    if how == "timeout":
        proc.send_signal(signal.SIGTERM)
    elif how.startswith("group"):
        os.killpg(proc.pid, SIGNAL.get(how, signal.SIGTERM))
    else:
        proc.send_signal(SIGNAL.get(how, signal.SIGTERM))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "received: finishing the run to keep what was measured" in out
    assert "the run stopped early; its" in out and "measured entries were kept" in out
    assert "crashed" not in out and "FAILED" not in out and "node down" not in out, out
    assert entries(tmp_path) >= measured - 2, out  # a worker's last test may not report
    # the gate saw only the tests that ran: it never says the run passed it
    assert "degrade gate passed on the dispatches it received (" in out
    assert "degrade gate passed\n" not in out


def test_a_second_signal_stops_at_once_and_damages_nothing(tmp_path: Path) -> None:
    proc = start(tmp_path)
    wait_for(tmp_path, 3, proc)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode in (-signal.SIGTERM, pytest.ExitCode.INTERRUPTED)
    if (tmp_path / "c.json").exists():
        entries(tmp_path)  # whole, never half written
