"""``--arbiter-recheck`` in real pytest runs: a cached winner made slower between runs
is flagged ``stale`` (summary, histogram, JUnit, the fleet's ``gate`` and ``stale``
views), fails the run with ``=fail``, and is replaced under ``--arbiter-tune``; an
unchanged corpus is never flagged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = '''
import os
import numpy as np
import pytest_arbiter


def _reference(a, b):
    return np.matmul(a, b)


pytest_arbiter.op("product", reference=_reference)


def _work(a, b, times):
    out = a @ b
    for _ in range(times - 1):
        out = a @ b
    return out


@pytest_arbiter.candidate("product", target="cpu", name="alpha")
def alpha(a, b):
    # an environment switch stands in for a driver update that slowed this kernel
    return _work(a, b, 12 if os.environ.get("SLOW_ALPHA") else 1)


@pytest_arbiter.candidate("product", target="cpu", name="beta")
def beta(a, b):
    return _work(a, b, 4)
'''

TESTS = '''
import numpy as np
import pytest_arbiter


def test_product():
    a = np.ones((48, 48), np.float32)
    for _ in range(3):
        assert (pytest_arbiter.dispatch("product", a, a) == 48).all()
'''


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_arbiter.cli.main", *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_product=TESTS)
    tuned = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--arbiter-tune",
                                          "--arbiter-cache=corpus.json")
    assert tuned.ret == 0, tuned.stdout.str()
    corpus = json.loads((pytester.path / "corpus.json").read_text())
    (entry,) = corpus["entries"]
    assert entry["ranking"][0]["name"] == "alpha"
    return pytester


RUN = ("-p", "no:cacheprovider", "--arbiter-cache=corpus.json")


@pytest.mark.slow
def test_an_unchanged_corpus_is_never_flagged(project: pytest.Pytester) -> None:
    for _ in range(3):
        # a clean run's summary is one line; -v gives the recheck's
        result = project.runpytest_subprocess(*RUN, "-v", "--arbiter-recheck=fail")
        assert result.ret == 0, result.stdout.str()
        result.stdout.fnmatch_lines(["*recheck: 1 cached keys re-timed: 0 stale, 1 current*"])


@pytest.mark.slow
def test_a_slower_winner_is_stale_and_fails_the_run_with_fail(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOW_ALPHA", "1")
    report = project.runpytest_subprocess(*RUN, "--arbiter-recheck",
                                          "--junitxml=runner.xml",
                                          "--arbiter-histogram=histogram.json")
    assert report.ret == 0, report.stdout.str()  # report only by default
    report.stdout.fnmatch_lines([
        "*recheck: 1 cached keys re-timed: 1 stale*",
        "*cpu/product/*: stale: the cached winner alpha now takes *x the time of beta*",
        "*report only: --arbiter-recheck=fail gates stale keys*",
    ])
    histogram = json.loads((project.path / "histogram.json").read_text())
    assert {(e["selected"], e["outcome"]) for e in histogram["entries"]} >= {
        ("alpha", "stale")}
    xml = (project.path / "runner.xml").read_text()
    assert 'name="arbiter-stale:0"' in xml

    listed = cli("stale", str(project.path / "runner.xml"))
    assert listed.returncode == 0, listed.stderr
    assert "1 stale key" in listed.stdout
    assert "stale: the cached winner alpha" in listed.stdout
    as_json = json.loads(cli("stale", "--json", str(project.path / "runner.xml")).stdout)
    assert [k["key"].split("/")[:2] for k in as_json] == [["cpu", "product"]]
    baseline = str(project.path / "baseline.json")
    assert cli("gate", "--baseline", baseline, str(project.path / "runner.xml")
               ).returncode == 0
    gated = cli("gate", "--stale=fail", "--baseline", baseline, str(project.path / "runner.xml"))
    assert gated.returncode == 1, gated.stdout
    assert "NEW stale: target=cpu op=product candidate=alpha" in gated.stdout

    failed = project.runpytest_subprocess(*RUN, "--arbiter-recheck=fail")
    assert failed.ret != 0
    failed.stdout.fnmatch_lines(["*degrade gate FAILED: new degraded, rejected, error or "
                                 "stale*"])


@pytest.mark.slow
def test_under_tune_the_recheck_replaces_the_stale_entry(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOW_ALPHA", "1")
    tuned = project.runpytest_subprocess(*RUN, "--arbiter-tune", "--arbiter-recheck")
    assert tuned.ret == 0, tuned.stdout.str()
    corpus = json.loads((Path(project.path) / "corpus.json").read_text())
    (entry,) = corpus["entries"]
    assert entry["ranking"][0]["name"] == "beta"
    again = project.runpytest_subprocess(*RUN, "--arbiter-recheck=fail")
    assert again.ret == 0, again.stdout.str()


FOUR_OPS = '''
import os
import numpy as np
import pytest_arbiter


def _work(a, b, times):
    out = a @ b
    for _ in range(times - 1):
        out = a @ b
    return out


for i in range(4):
    pytest_arbiter.op(f"product{i}", reference=np.matmul)
    # an environment switch stands in for a driver update: 45x slower, calls of
    # milliseconds, past the 10 ms key budget before the warmup ends
    pytest_arbiter.candidate(f"product{i}", target="cpu", name=f"alpha{i}")(
        lambda a, b: _work(a, b, 45 if os.environ.get("SLOW_ALPHA") else 1))
    pytest_arbiter.candidate(f"product{i}", target="cpu", name=f"beta{i}")(
        lambda a, b: _work(a, b, 2))
'''

FOUR_TESTS = '''
import numpy as np
import pytest
import pytest_arbiter


@pytest.mark.parametrize("i", range(4))
def test_product(i):
    a = np.ones((128, 128), np.float32)
    assert (pytest_arbiter.dispatch(f"product{i}", a, a) == 128).all()
'''


@pytest.mark.slow
def test_a_45x_slower_winner_is_stale_on_every_key_with_the_defaults(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    pytester.makeconftest(FOUR_OPS)
    pytester.makepyfile(test_product=FOUR_TESTS)
    tuned = pytester.runpytest_subprocess(*RUN, "--arbiter-tune")
    assert tuned.ret == 0, tuned.stdout.str()
    corpus = json.loads((pytester.path / "corpus.json").read_text())
    assert sorted(e["ranking"][0]["name"] for e in corpus["entries"]) == [
        f"alpha{i}" for i in range(4)]
    monkeypatch.setenv("SLOW_ALPHA", "1")
    for _ in range(2):
        result = pytester.runpytest_subprocess(*RUN, "--arbiter-recheck=fail")
        assert result.ret != 0
        result.stdout.fnmatch_lines(
            ["*recheck: 4 cached keys re-timed: 4 stale, 0 current, 0 without a verdict*"])
