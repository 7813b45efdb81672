"""A baseline entry is "fixed" only when the run proves it: the kernel passed the F4
gate (or ran) in the run and never failed, or it is gone from its op. A kernel merely
unavailable on this runner, or not reached by a subset, is unchecked and stays in the
baseline, in the run's summary and in ``pytest-arbiter gate --update`` alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = '''
import os

import numpy as np
import pytest_arbiter

pytest_arbiter.op("ev_scale", reference=lambda x: x * 2.0)


@pytest_arbiter.candidate("ev_scale", target="cpu", name="ev_good")
def good(x):
    return x * 2.0


@pytest_arbiter.candidate("ev_scale", target="cpu", name="ev_bad",
                          available=lambda: os.environ.get("EV_NO_BAD") != "1")
def bad(x):
    return x * (2.0 if os.environ.get("EV_FIXED") == "1" else 3.0)
'''

TEST = '''
import numpy as np
import pytest_arbiter


def test_scale():
    np.testing.assert_allclose(pytest_arbiter.dispatch("ev_scale", np.arange(64.0)),
                               np.arange(64.0) * 2.0)
'''


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
        *args: str) -> pytest.RunResult:
    for name in ("EV_NO_BAD", "EV_FIXED"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", *args)


def gate_update(path: Path, report: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "pytest_arbiter.cli.main", "gate", "--baseline",
                           str(path), "--update", str(report)],
                          capture_output=True, text=True, check=False)
    return done.stdout + done.stderr


def baseline_keys(path: Path) -> set[str]:
    """The baseline's gated entries (a written baseline holds the won ones too)."""
    return {f"{e['selected']}/{e['outcome']}" for e in json.loads(path.read_text())["entries"]
            if e["outcome"] != "won"}


@pytest.mark.slow
def test_a_kernel_unavailable_on_this_runner_is_never_called_fixed(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_scale=TEST)
    wrote = run(pytester, monkeypatch, {}, "--arbiter-write-baseline=b.json")
    assert wrote.ret == 0, wrote.stdout.str()
    assert baseline_keys(pytester.path / "b.json") == {"ev_bad/rejected"}

    # the bad kernel cannot run on this runner: nothing proves it fixed
    missing = run(pytester, monkeypatch, {"EV_NO_BAD": "1"}, "--arbiter-baseline=b.json",
                  "--junitxml=j.xml")
    text = missing.stdout.str()
    assert missing.ret == 0, text
    assert "fixed rejected" not in text
    assert "1 baseline entries not checked" in text
    gate_update(pytester.path / "b.json", pytester.path / "j.xml")
    assert baseline_keys(pytester.path / "b.json") == {"ev_bad/rejected"}

    # its code fixed: the gate passed it in this run, so it is fixed
    fixed = run(pytester, monkeypatch, {"EV_FIXED": "1"}, "--arbiter-baseline=b.json",
                "--junitxml=j2.xml")
    assert "fixed rejected: target=cpu op=ev_scale candidate=ev_bad" in fixed.stdout.str()
    out = gate_update(pytester.path / "b.json", pytester.path / "j2.xml")
    assert "1 fixed entry removed" in out, out
    assert baseline_keys(pytester.path / "b.json") == set()
