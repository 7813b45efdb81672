"""No run loses measurements or a baseline: subsets, collect-only, crashes, interrupts and
a held lock each leave every artifact whole (and say what they did)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_arbiter.gating import histogram_file
from pytest_arbiter.store import artifacts

pytestmark = pytest.mark.usefixtures("clean_registry")

TWO_OPS = '''
import pytest_arbiter

pytest_arbiter.op("wl_one", reference=lambda x: x + 1)
pytest_arbiter.op("wl_two", reference=lambda x: x + 2)


@pytest_arbiter.candidate("wl_one", target="cpu", name="wl_one_decliner")
def one(x):
    raise pytest_arbiter.Decline("not today")


@pytest_arbiter.candidate("wl_two", target="cpu", name="wl_two_decliner")
def two(x):
    raise pytest_arbiter.Decline("not today either")
'''

TESTS = '''
import numpy as np
import pytest_arbiter


def test_one():
    pytest_arbiter.dispatch("wl_one", np.ones(4))


def test_two():
    pytest_arbiter.dispatch("wl_two", np.ones(4))
'''


def _keys(path: Path) -> set[tuple[str, str, str, str]]:
    return {(e["target"], e["op"], e["selected"], e["outcome"])
            for e in json.loads(path.read_text())["entries"]}


DEGRADES = {("cpu", "wl_one", "wl_one_decliner", "degraded"),
            ("cpu", "wl_two", "wl_two_decliner", "degraded")}


@pytest.mark.parametrize("subset", [["-k", "test_one"], ["test_lib.py::test_one"],
                                    ["--deselect", "test_lib.py::test_two"]])
def test_a_subset_run_keeps_the_baseline_entries_of_the_tests_it_did_not_run(
        pytester: pytest.Pytester, subset: list[str]) -> None:
    pytester.makeconftest(TWO_OPS)
    pytester.makepyfile(test_lib=TESTS)
    assert pytester.runpytest("--arbiter-write-baseline=base.json").ret == 0
    assert _keys(pytester.path / "base.json") == DEGRADES
    result = pytester.runpytest(*subset, "--arbiter-write-baseline=base.json")
    assert result.ret == 0, result.stdout.str()
    assert _keys(pytester.path / "base.json") == DEGRADES
    result.stdout.fnmatch_lines(["*--arbiter-write-baseline *base.json: kept 1 entries this "
                                 "run could not check*"])
    # and the next full, gated run still passes on it
    assert pytester.runpytest("--arbiter-baseline=base.json").ret == 0


def test_a_full_run_drops_what_it_fixed_and_keeps_what_it_did_not_dispatch(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TWO_OPS)
    pytester.makepyfile(test_lib=TESTS)
    gpu = ("nvidia", "matmul", "wmma", "degraded")
    gone = ("cpu", "wl_one", "retired_kernel", "degraded")
    histogram_file.write_histogram(pytester.path / "base.json", {gpu: 1, gone: 2})
    assert pytester.runpytest("--arbiter-write-baseline=base.json").ret == 0
    assert _keys(pytester.path / "base.json") == {*DEGRADES, gpu}


def test_collect_only_writes_nothing(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TWO_OPS)
    pytester.makepyfile(test_lib=TESTS)
    histogram_file.write_histogram(pytester.path / "base.json", {next(iter(DEGRADES)): 1})
    before = (pytester.path / "base.json").read_bytes()
    result = pytester.runpytest("--co", "--arbiter-tune", "--arbiter-cache=c.json",
                                "--arbiter-write-baseline=base.json", "--arbiter-histogram=h.json")
    assert result.ret == 0
    assert not (pytester.path / "c.json").exists()
    assert not (pytester.path / "h.json").exists()
    assert (pytester.path / "base.json").read_bytes() == before
    result.stdout.fnmatch_lines(["*collect-only run: no artifact written*"])


@pytest.mark.slow
def test_an_interrupted_session_writes_no_histogram_or_baseline(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest(TWO_OPS)
    pytester.makepyfile(test_lib=TESTS + '''

def test_zz_interrupt():
    raise KeyboardInterrupt
''')
    histogram_file.write_histogram(pytester.path / "base.json", {next(iter(DEGRADES)): 1})
    before = (pytester.path / "base.json").read_bytes()
    # in a subprocess: an interrupt inside an in-process run would reach this one
    result = pytester.runpytest_subprocess("--arbiter-write-baseline=base.json",
                                           "--arbiter-histogram=h.json")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert not (pytester.path / "h.json").exists()
    assert (pytester.path / "base.json").read_bytes() == before
    result.stdout.fnmatch_lines(["*h.json not written: the run's counts are incomplete "
                                 "(the session was interrupted)*"])


def test_a_held_lock_saves_the_measurements_to_a_side_shard(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_mm='''
import numpy as np
import pytest_arbiter


def test_mm():
    a = np.ones((16, 16), np.float32)
    pytest_arbiter.dispatch("matmul", a, a)
''')
    cache = pytester.path / "c.json"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import filelock, sys, time\n"
         f"lock = filelock.FileLock({str(artifacts.lock_path(cache))!r}); lock.acquire()\n"
         "print('locked', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        monkeypatch.setattr(artifacts, "LOCK_TIMEOUT_S", 0.5)
        result = pytester.runpytest("--arbiter-tune", f"--arbiter-cache={cache}")
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    shards = list(pytester.path.glob("c.shard-*.json"))
    assert len(shards) == 1, result.stdout.str()
    assert [e.op for e in artifacts.read_cache(shards[0]).entries()] == ["matmul"]
    result.stdout.fnmatch_lines([f"*fold them in with: pytest-arbiter merge -o {cache} "
                                 f"{shards[0]}*"])

