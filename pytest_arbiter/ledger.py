"""A run's dispatch record, without pytest: what the summary, the artifacts and the gate
are made from.

One :class:`RunLedger` per pytest process. It holds this process's dispatch counts
(the arbiter's histogram), the entries of tests that degrade on purpose, the tests
behind each entry, and, on the controlling process of a pytest-xdist run, what each
worker sent (:meth:`RunLedger.absorb` of the worker's :meth:`RunLedger.payload`).
Everything the run reports is read from here: the counts of the whole run, the
dispatch events (one per key: a measured one wins), the reasons, and the cache entries
the run measured, where two workers' entries for one key resolve by the merge rule
(:func:`pytest_arbiter.corpus.prefer`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pytest_arbiter.histogram import DispatchHistogram, HistogramKey, merge_counts

if TYPE_CHECKING:
    from pytest_arbiter.arbiter import Arbiter, DispatchEvent
    from pytest_arbiter.cache import CacheEntry, KeyTuple

EventKey = tuple[str, ...]
"""(target, op, bucket, dtype): a dispatch event's key."""


class RunLedger:
    """Counts, events, reasons and measured entries of one run (see the module)."""

    def __init__(self) -> None:
        self.histogram = DispatchHistogram()
        """This process's dispatch counts (the arbiter records into it)."""
        self.expected = DispatchHistogram()
        """The entries of this process's tests that degrade on purpose."""
        self.tests: dict[HistogramKey, list[str]] = {}
        """The tests behind each entry (in the order they ran; workers' appended)."""
        self.arbiter: Arbiter | None = None
        self.read_entries: dict[KeyTuple, CacheEntry] = {}
        """The cache entries the run read: what it measured is everything else."""
        self.worker_counts: list[dict[HistogramKey, int]] = []
        self.worker_expected: list[dict[HistogramKey, int]] = []
        self.worker_events: list[DispatchEvent] = []
        self.worker_reasons: dict[HistogramKey, str] = {}
        self.crashed: list[str] = []
        """Workers that sent nothing (crashed): the run's counts are incomplete."""
        self.errors: list[str] = []
        """What went wrong with the run's data or artifacts: each fails the run."""
        self.notes: list[str] = []
        """What the session end did with the artifacts, for the summary."""
        self.junit_recorded: dict[HistogramKey, int] = {}
        """The ``arbiter:`` counts the JUnit report's testcases hold (controller only)."""

    def use(self, arbiter: Arbiter) -> None:
        """The run's arbiter, built at the first dispatch; its cache as read now."""
        self.arbiter = arbiter
        self.read_entries = arbiter.cache.by_key()

    # -- counts -----------------------------------------------------------------------

    def counts(self) -> dict[HistogramKey, int]:
        """All dispatch counts of the run (this process plus the workers')."""
        return merge_counts([self.histogram.counts(), *self.worker_counts])

    def expected_counts(self) -> dict[HistogramKey, int]:
        return merge_counts([self.expected.counts(), *self.worker_expected])

    def gated_counts(self) -> dict[HistogramKey, int]:
        """Counts minus the entries of tests that degrade on purpose."""
        expected = self.expected_counts()
        out = {}
        for key, count in self.counts().items():
            left = count - expected.get(key, 0)
            if left > 0:
                out[key] = left
        return out

    def reasons(self) -> dict[HistogramKey, str]:
        """Why each failing entry happened: this process's first reason, else a worker's."""
        own = self.arbiter.reasons if self.arbiter is not None else {}
        return {**self.worker_reasons, **own}

    def record_test(self, nodeid: str, before: Mapping[HistogramKey, int],
                    expected: bool) -> list[tuple[HistogramKey, int]]:
        """What test ``nodeid`` dispatched since the counts were ``before``, recorded
        under its name, or as expected when it degrades on purpose; sorted."""
        delta = sorted(self.histogram.minus(before).items())
        if expected and delta:
            # its entries do not count against the gate: never named behind a failing one
            self.expected.merge(dict(delta))
        else:
            for key, _ in delta:
                self.tests.setdefault(key, []).append(nodeid)
        return delta

    # -- events and entries -----------------------------------------------------------

    def events(self) -> dict[EventKey, DispatchEvent]:
        """Dispatch events of this process and the workers; a measured one wins a key,
        and a recheck that found the key stale is kept whichever event wins it."""
        merged: dict[EventKey, DispatchEvent] = {}
        stale: dict[EventKey, str] = {}
        own = self.arbiter.events.values() if self.arbiter is not None else ()
        for event in [*self.worker_events, *own]:
            key: EventKey = (event.target, event.op, event.bucket, event.dtype)
            previous = merged.get(key)
            if previous is None or previous.source != "measured":
                merged[key] = event
            if event.recheck.startswith("stale:"):
                stale.setdefault(key, event.recheck)
        # a worker that found the key stale is heard, whatever another one found after
        for key, line in stale.items():
            merged[key] = dataclasses.replace(merged[key], recheck=line)
        return merged

    def stale_keys(self, events: Mapping[EventKey, DispatchEvent] | None = None
                   ) -> list[str]:
        """One line per key a recheck found stale: the key and what was found (of
        ``events``, :meth:`events` when not given)."""
        return [f"{'/'.join(key)}: {event.recheck}"
                for key, event in sorted((self.events() if events is None
                                          else events).items())
                if event.recheck.startswith("stale:")]

    def measured_entries(self) -> list[CacheEntry]:
        """The entries this run (and its workers) measured, not those it read."""
        if self.arbiter is None:
            return []
        read = self.read_entries
        return [e for key, e in self.arbiter.cache.by_key().items() if read.get(key) is not e]

    def take_measured(self, entries: Iterable[CacheEntry]) -> None:
        """Add a worker's measured entries: they replace what the run read, and two
        workers' entries for one key resolve by the merge rule, not by who came last."""
        from pytest_arbiter.corpus import prefer

        assert self.arbiter is not None, "take_measured needs the run's arbiter"
        cache = self.arbiter.cache
        read = self.read_entries
        for entry in entries:
            held = cache.get(entry.key)
            if held is not None and read.get(entry.key) is not held:
                entry = prefer(held, entry)
            cache.put(entry)

    # -- a pytest-xdist worker's data -------------------------------------------------

    def payload(self) -> dict[str, Any]:
        """What a worker sends the controller: plain JSON values."""
        used = self.arbiter
        measured = None
        if used is not None:
            from pytest_arbiter.cache import MeasureCache

            # only what this worker measured: the controller read the same cache file
            measured = MeasureCache(self.measured_entries()).to_dict()
        return {
            "histogram": self.histogram.to_dict(),
            "expected": self.expected.to_dict(),
            # None: this worker never dispatched, so it has nothing to add to the cache
            "cache": measured,
            "events": [dataclasses.asdict(e) for e in used.events.values()] if used else [],
            "reasons": [[*key, why] for key, why in sorted(self.reasons().items())],
            "tests": [[*key, nodeids] for key, nodeids in sorted(self.tests.items())],
        }

    def absorb(self, name: str, payload: Any,
               take_measured: Callable[[list[CacheEntry]], None] | None = None) -> None:
        """Add worker ``name``'s :meth:`payload` (None: the worker crashed). A payload
        that cannot be read is an error of the run, never counts silently lost.
        ``take_measured``: what adds the worker's measured entries (default
        :meth:`take_measured`; the plugin's builds the run's arbiter first)."""
        if not isinstance(payload, dict):
            self.crashed.append(name)
            return
        try:
            self.worker_counts.append(DispatchHistogram.from_dict(
                payload["histogram"], source=f"worker {name}").counts())
            self.worker_expected.append(DispatchHistogram.from_dict(
                payload["expected"], source=f"worker {name}").counts())
            for key, why in _keyed(payload.get("reasons", []), "reasons"):
                self.worker_reasons.setdefault(key, str(why))
            for key, nodeids in _keyed(payload.get("tests", []), "tests"):
                self.tests.setdefault(key, []).extend(str(n) for n in nodeids)
            if payload["cache"] is not None:
                from pytest_arbiter.arbiter import DispatchEvent
                from pytest_arbiter.cache import MeasureCache

                entries = MeasureCache.from_dict(payload["cache"],
                                                 source=f"worker {name}").entries()
                (take_measured or self.take_measured)(entries)
                self.worker_events.extend(DispatchEvent(**e)
                                          for e in payload.get("events", []))
        except (KeyError, TypeError, ValueError) as exc:
            self.errors.append(f"worker {name} sent unreadable arbiter data: {exc}")


def _keyed(rows: Any, what: str) -> list[tuple[HistogramKey, Any]]:
    """``[[target, op, selected, outcome, value], ...]`` from a worker, checked."""
    out = []
    for row in rows:
        if (not isinstance(row, list) or len(row) != 5
                or not all(isinstance(part, str) for part in row[:4])):
            raise ValueError(f"bad {what} row {row!r}")
        out.append((HistogramKey(row[0], row[1], row[2], row[3]), row[4]))
    return out
