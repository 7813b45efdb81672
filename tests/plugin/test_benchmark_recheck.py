"""``--arbiter-recheck --arbiter-benchmark-json``: each key a run re-timed is exported
as one benchmark per candidate with the recheck's statistics, beside the measured
ones' scheme (same ``group``, ``name``, ``fullname``), read back by pytest-benchmark's
own storage; under pytest-xdist too (the workers' rechecks travel to the controller)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_arbiter.session.ledger import RunLedger
from tests.plugin.test_recheck_plugin import CONFTEST, RUN, TESTS

pytest.importorskip("pytest_benchmark")
from pytest_benchmark.storage.file import FileStorage

pytest_plugins = ["pytester"]


class StrictLogger:
    """pytest-benchmark's logger; a warning ("Failed to load") fails the test."""

    def warning(self, text: str, **_: Any) -> None:
        raise AssertionError(text)

    def info(self, text: str, **_: Any) -> None:
        pass

    debug = info


def load(path: Path) -> list[dict[str, Any]]:
    storage = FileStorage(path.parent / "storage", logger=StrictLogger())
    return list(storage.load_benchmarks(str(path)))


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "xdist"])
def test_a_recheck_run_exports_the_rechecked_candidates(
        pytester: pytest.Pytester, workers: tuple[str, ...]) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_product=TESTS)
    tuned = pytester.runpytest_subprocess(*RUN, "--arbiter-tune",
                                          "--arbiter-benchmark-json=tuned.json")
    assert tuned.ret == 0, tuned.stdout.str()
    measured = load(pytester.path / "tuned.json")
    assert {b["extra_info"]["arbiter_source"] for b in measured} == {"measure"}

    result = pytester.runpytest_subprocess(*RUN, *workers, "--arbiter-recheck",
                                           "--arbiter-benchmark-json=b.json")
    assert result.ret == 0, result.stdout.str()
    rechecked = load(pytester.path / "b.json")
    assert {b["extra_info"]["arbiter_source"] for b in rechecked} == {"recheck"}
    assert sorted(b["name"] for b in rechecked) == ["alpha", "beta"]
    # the same time series as the tuning run's comparison
    assert ({b["fullname"] for b in rechecked}
            == {b["fullname"] for b in measured if b["name"] in ("alpha", "beta")})
    assert len({b["group"] for b in rechecked}) == 1
    for bench in rechecked:  # the loader lifts the stats into the benchmark
        assert bench["rounds"] >= 1
        assert 0 < bench["min"] <= bench["median"] <= bench["max"]
        assert bench["extra_info"]["arbiter_winner"] == (bench["name"] == "alpha")


def test_a_worker_payload_without_rechecks_is_still_read() -> None:
    worker = RunLedger().payload()
    del worker["rechecks"]
    ledger = RunLedger()
    ledger.absorb("gw0", worker)
    assert not ledger.errors and ledger.rechecks() == []
    ledger.absorb("gw1", {**worker, "rechecks": [["bad"]]})
    assert ledger.errors
