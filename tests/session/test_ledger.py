"""The run's ledger, the controller's verdict and the summary, without pytest: what the
plugin's hooks are made of."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_arbiter.decision.selection import DispatchEvent
from pytest_arbiter.gating import histogram_file
from pytest_arbiter.gating.baseline import failing_outcomes
from pytest_arbiter.gating.completeness import RunScope
from pytest_arbiter.gating.histogram import DispatchHistogram
from pytest_arbiter.session.controller import Controller
from pytest_arbiter.session.ledger import RunLedger
from pytest_arbiter.session.settings import ArbiterSettings
from pytest_arbiter.session.summary import render
from pytest_arbiter.store.cache import MeasureCache
from tests.factories import cache_entry

KEY = ("cpu", "matmul", "64x64x64/a16.16.16", "float32")
STALE_LINE = "stale: the cached winner a now takes 3x the time of b (sign test p=1e-9, 40 " \
             "paired rounds)"


def event(recheck: str, source: str = "cached") -> DispatchEvent:
    return DispatchEvent(*KEY, source=source, order=["a", "b"], passed_over={},
                         recheck=recheck,
                         recheck_status="stale" if recheck.startswith("stale:") else
                         "current" if recheck else "")


def payload(events: list[DispatchEvent], counts: dict[tuple[str, ...], int]) -> dict[str, Any]:
    import dataclasses

    histogram = DispatchHistogram()
    for key, count in counts.items():
        histogram.add(key, count)  # type: ignore[arg-type]
    return {"histogram": histogram_file.payload(histogram.counts()),
            "expected": histogram_file.payload({}),
            "cache": {"schema": "pytest-arbiter/cache", "version": 3, "entries": []},
            "events": [dataclasses.asdict(e) for e in events], "reasons": [], "tests": []}


def test_a_workers_stale_finding_survives_another_workers_event_for_the_key() -> None:
    ledger = RunLedger()
    ledger.absorb("gw0", payload([event(STALE_LINE)], {("cpu", "matmul", "a", "stale"): 1}),
                  take_measured=lambda entries: None)
    ledger.absorb("gw1", payload([event("not re-timed: the run's recheck budget was spent")],
                                 {("cpu", "matmul", "a", "won"): 3}),
                  take_measured=lambda entries: None)
    assert ledger.stale_keys() == [f"{'/'.join(KEY)}: {STALE_LINE}"]
    assert ledger.counts() == {("cpu", "matmul", "a", "stale"): 1,
                               ("cpu", "matmul", "a", "won"): 3}


def test_the_controller_keeps_the_workers_worst_fallback_reason() -> None:
    """Two workers saw the same missing winner fall back, by 1.2x and by 9x: the run's
    reason is the 9x one, whichever worker reported first."""
    key = ["cpu", "lse", "fast", "degraded"]
    ledger = RunLedger()
    for name, why, severity in (("gw0", "1.2x slower", 1.2), ("gw1", "9x slower", 9.0),
                                ("gw2", "3x slower", 3.0)):
        sent = payload([], {tuple(key): 1})
        sent["reasons"] = [[*key, [why, severity]]]
        ledger.absorb(name, sent, take_measured=lambda entries: None)
    assert ledger.reasons() == {tuple(key): "9x slower"}


def test_the_workers_strict_refusals_are_summed() -> None:
    ledger = RunLedger()
    for name, refused in (("gw0", {"no cached winner": 2}),
                          ("gw1", {"no cached winner": 1, "a stale entry": 1})):
        sent = payload([], {})
        sent["refused"] = refused
        ledger.absorb(name, sent, take_measured=lambda entries: None)
    assert ledger.refused() == {"no cached winner": 3, "a stale entry": 1}
    garbled = payload([], {})
    garbled["refused"] = ["x"]
    ledger.absorb("gw2", garbled, take_measured=lambda entries: None)
    assert len(ledger.errors) == 1 and "worker gw2 sent unreadable arbiter data" in \
        ledger.errors[0]


def test_a_crashed_or_garbled_worker_is_never_silently_lost() -> None:
    ledger = RunLedger()
    ledger.absorb("gw0", None)
    ledger.absorb("gw1", {"histogram": {"entries": "nope"}})
    assert ledger.crashed == ["gw0"]
    assert len(ledger.errors) == 1 and "worker gw1 sent unreadable arbiter data" in \
        ledger.errors[0]


def test_the_controller_writes_the_histogram_and_fails_on_a_new_stale_with_fail(
        tmp_path: Path) -> None:
    ledger = RunLedger()
    ledger.histogram.add(("cpu", "matmul", "a", "stale"))
    settings = ArbiterSettings(histogram=tmp_path / "h.json", recheck="fail")
    assert failing_outcomes(stale=False) == ("degraded", "rejected", "error")
    assert failing_outcomes(stale=True) == ("degraded", "rejected", "error", "stale")
    end = Controller(settings, ledger, {}).finish(RunScope())
    assert end.verdict is not None and not end.verdict.passed
    assert (tmp_path / "h.json").exists()
    lines = render(ledger, settings, cache_note=None, baseline_note="no baseline", end=end)
    assert "degrade gate FAILED: new degraded, rejected, error or stale dispatch entries " \
        "(fix the kernel, mark the test arbiter_expect_degrade, or add them to the " \
        "baseline)" in lines
    assert any(line.startswith("stale cached winners: re-tune") for line in lines)
    report_only = ArbiterSettings(recheck="report")
    end = Controller(report_only, ledger, {}).finish(RunScope())
    assert end.verdict is not None and end.verdict.passed


class _NoWalk(MeasureCache):
    """A cache that refuses to be walked: a run finds what it measured by the keys put."""

    def by_key(self) -> dict[Any, Any]:
        raise AssertionError("the whole cache was walked")

    def __iter__(self) -> Any:
        raise AssertionError("the whole cache was walked")

    def entries(self) -> list[Any]:
        raise AssertionError("the whole cache was walked")


def test_what_the_run_measured_is_found_without_walking_the_cache() -> None:
    from types import SimpleNamespace

    read = [cache_entry(f"b{i}") for i in range(5)]
    cache = _NoWalk(read)
    early = cache_entry("early")
    cache.put(early)  # before the run's arbiter: what the run read
    ledger = RunLedger()
    ledger.use(SimpleNamespace(cache=cache))  # type: ignore[arg-type]
    replaced, new = cache_entry("b1", winner="b"), cache_entry("new")
    cache.put(replaced)
    cache.put(new)
    cache.put(read[3])  # the entry it held: nothing measured
    ledger.take_measured([cache_entry("b2", winner="b"), cache_entry("worker")])
    assert sorted(e.bucket for e in ledger.measured_entries()) == ["b1", "b2", "new",
                                                                   "worker"]
    assert early not in ledger.measured_entries()
