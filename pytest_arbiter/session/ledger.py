"""A run's dispatch record, without pytest: what the summary, the artifacts and the gate
are made from.

One :class:`RunLedger` per pytest process. It holds this process's dispatch counts
(the arbiter's histogram), the entries of tests that degrade on purpose, the tests
behind each entry, and, on the controlling process of a pytest-xdist run, what each
worker sent (:meth:`RunLedger.absorb` of the worker's :meth:`RunLedger.payload`).
Everything the run reports is read from here: the counts of the whole run, the
dispatch events (one per key: a measured one wins), the reasons, and the cache entries
the run measured, where two workers' entries for one key resolve by the merge rule
(:func:`pytest_arbiter.store.corpus.prefer`).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from pytest_arbiter.gating.baseline import Evidence
from pytest_arbiter.gating.histogram import (
    OUTCOMES,
    DispatchHistogram,
    FindingKey,
    HistogramKey,
    Reasons,
    finding_counts,
    merge_counts,
)

if TYPE_CHECKING:
    from pytest_arbiter.decision.arbiter import Arbiter
    from pytest_arbiter.decision.selection import DispatchEvent
    from pytest_arbiter.store.cache import CacheEntry, KeyTuple
    from pytest_arbiter.timing.measure import LatencyStats

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
        self.read_entries: dict[KeyTuple, CacheEntry | None] = {}
        """The entries of the keys the cache had changed before :meth:`use`, as they
        were then (any other key's entry at that time: :meth:`_read`)."""
        self.worker_counts: list[dict[HistogramKey, int]] = []
        self.worker_expected: list[dict[HistogramKey, int]] = []
        self.worker_events: list[DispatchEvent] = []
        self.worker_reasons = Reasons()
        self.worker_refused: collections.Counter[str] = collections.Counter()
        self.worker_evidence: dict[str, set[tuple[str, str, str]]] = {
            "checked": set(), "failed": set(), "registered": set()}
        """What the workers saw of their candidates (:meth:`evidence`)."""
        self.crashed: list[str] = []
        """Workers that sent nothing (crashed): the run's counts are incomplete."""
        self.errors: list[str] = []
        """What went wrong with the run's data or artifacts: each fails the run."""
        self.notes: list[str] = []
        """What the session end did with the artifacts, for the summary."""
        self.worker_findings: dict[FindingKey, str] = {}
        """The workers' findings (see :mod:`pytest_arbiter.decision.record`)."""
        self.worker_reached: set[FindingKey] = set()
        """The findings a worker's dispatch reached."""
        self.expected_findings: set[FindingKey] = set()
        """Findings made by tests that degrade on purpose."""
        self._attributed: set[FindingKey] = set()
        self._excluded: set[FindingKey] = set()
        self._attempts: dict[str, tuple[dict[HistogramKey, int], bool]] = {}
        self.junit_by_test: dict[str, dict[HistogramKey, int]] = {}
        """The ``arbiter:`` counts of each test's last JUnit record (controller only)."""
        self.worker_rechecks: dict[KeyTuple, tuple[str, dict[str, LatencyStats]]] = {}
        """The workers' rechecks: per key, the cached winner and each timed candidate's
        statistics (the first worker's, like this process's own in :meth:`rechecks`)."""
        self.worker_unavailable: set[Unavailable] = set()
        """The candidates the workers found unavailable (the controller may not even
        import the modules that register them)."""

    def use(self, arbiter: Arbiter) -> None:
        """The run's arbiter, built at the first dispatch; its cache as read now."""
        self.arbiter = arbiter
        cache = arbiter.cache
        # the cache says which keys change from now on; no walk of a big corpus
        self.read_entries = {key: cache.get(key) for key in cache.changes()}

    def _read(self, key: KeyTuple, changes: Mapping[KeyTuple, CacheEntry | None]
              ) -> CacheEntry | None:
        """The entry ``key`` held at :meth:`use` (``changes``: the cache's)."""
        if key in self.read_entries:
            return self.read_entries[key]
        if key in changes:
            return changes[key]
        assert self.arbiter is not None
        return self.arbiter.cache.get(key)

    # -- counts -----------------------------------------------------------------------

    @property
    def junit_recorded(self) -> dict[HistogramKey, int]:
        """The ``arbiter:`` counts the JUnit report's testcases hold: each test's last
        record (a retried test's earlier attempts are not what the gate counts)."""
        return merge_counts(self.junit_by_test.values())

    def own_findings(self) -> tuple[dict[FindingKey, str], set[FindingKey]]:
        """This process's findings and the ones a dispatch reached (one snapshot)."""
        return self.arbiter.record.snapshot() if self.arbiter is not None else ({}, set())

    def dispatch_counts(self) -> dict[HistogramKey, int]:
        """This process's counts without the findings no dispatch of it reached: what
        its dispatches alone did."""
        counts = self.histogram.counts()
        found, reached = self.own_findings()
        unreached = [f for f in found if f not in reached]
        for key, count in finding_counts(unreached).items():
            left = counts.pop(key, 0) - count
            if left > 0:
                counts[key] = left
        return counts

    def findings(self) -> dict[FindingKey, str]:
        """Every finding of the run no dispatch of the run reached, each once."""
        found, reached = self.own_findings()
        reached |= self.worker_reached
        return {f: why for f, why in {**self.worker_findings, **found}.items()
                if f not in reached}

    def counts(self) -> dict[HistogramKey, int]:
        """All counts of the run: every dispatch once (this process plus the workers'),
        and every finding no dispatch reached once per key and run, whichever process
        found it (the counting rule: :mod:`pytest_arbiter.decision.record`)."""
        return merge_counts([self.dispatch_counts(), *self.worker_counts,
                             finding_counts(self.findings())])

    def own_evidence(self) -> dict[str, set[tuple[str, str, str]]]:
        """This process's candidates: gated and passed or ran (``checked``), failed the
        gate or raised (``failed``), registered for an op it planned."""
        arb = self.arbiter
        if arb is None:
            return {"checked": set(), "failed": set(), "registered": set()}
        counts = self.histogram.counts()
        ran = {(k.target, k.op, k.selected) for k in counts if k.outcome == "won"}
        bad = {(k.target, k.op, k.selected) for k in counts
               if k.outcome in ("rejected", "error")}
        return {"checked": set(arb.gates.passed) | ran, "failed": set(arb.gates.failed) | bad,
                "registered": set(arb.plans.registered)}

    def evidence(self) -> Evidence:
        """What the whole run saw of its candidates: the proof a baseline entry it no
        longer shows is fixed (:class:`pytest_arbiter.gating.baseline.Evidence`)."""
        own, theirs = self.own_evidence(), self.worker_evidence
        return Evidence.of(own["checked"] | theirs["checked"],
                           own["failed"] | theirs["failed"],
                           own["registered"] | theirs["registered"])

    def expected_counts(self) -> dict[HistogramKey, int]:
        found = finding_counts(f for f in self.findings() if f in self.expected_findings)
        return merge_counts([self.expected.counts(), *self.worker_expected, found])

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
        """Why each failing entry happened: the most severe reason of this process and
        the workers (this process's first among equals)."""
        return self._reasons().text

    def refused(self) -> dict[str, int]:
        """Strict mode's refused dispatches by what was refused, this process's and the
        workers'."""
        total = collections.Counter(self.worker_refused)
        if self.arbiter is not None:
            total.update(self.arbiter.record.refused_now())
        return dict(total)

    def _reasons(self) -> Reasons:
        merged = Reasons()
        if self.arbiter is not None:
            merged.take(self.arbiter.record.reasons_now())
        merged.take(self.worker_reasons)
        return merged

    def record_test(self, nodeid: str, before: Mapping[HistogramKey, int],
                    expected: bool, *, once: bool = False) -> list[tuple[HistogramKey, int]]:
        """What test ``nodeid`` dispatched since the counts were ``before``, recorded
        under its name, or as expected when it degrades on purpose; sorted. Findings
        made meanwhile name the test but are not in what it dispatched (they are counted
        once per key and run, outside any test's count). A test recorded again (a rerun
        of a flaky test) counts its last attempt only; ``once`` (a test using the
        pytest-benchmark fixture, whose timing rounds call the code again and again)
        counts each of its entries once."""
        delta_counts = self._dispatched(nodeid, before, expected)
        if once:
            excess = {k: v - 1 for k, v in delta_counts.items() if v > 1}
            self.histogram.discount(excess)
            delta_counts = dict.fromkeys(delta_counts, 1)
        self._forget_attempt(nodeid)
        self._attempts[nodeid] = (dict(delta_counts), expected)
        delta = sorted(delta_counts.items())
        if expected and delta:
            # its entries do not count against the gate: never named behind a failing one
            self.expected.merge(dict(delta))
        else:
            for key, _ in delta:
                self.tests.setdefault(key, []).append(nodeid)
        return delta

    def _forget_attempt(self, nodeid: str) -> None:
        """Take back what an earlier attempt of ``nodeid`` recorded."""
        earlier = self._attempts.pop(nodeid, None)
        if earlier is None:
            return
        counts, expected = earlier
        self.histogram.discount(counts)
        if expected:
            self.expected.discount(counts)
            return
        for key in counts:
            names = self.tests.get(key, [])
            if nodeid in names:
                names.remove(nodeid)

    def _dispatched(self, nodeid: str, before: Mapping[HistogramKey, int],
                    expected: bool) -> dict[HistogramKey, int]:
        """The test's dispatch counts, its findings taken out (see :meth:`record_test`)."""
        found, reached = self.own_findings()
        made = [f for f in found if f not in self._attributed]
        self._attributed.update(made)
        delta_counts = self.histogram.minus(before)
        # a finding made now that no dispatch reached is counted once per run, outside
        # any test; one made earlier that a dispatch of this test reached is its dispatch
        unreached = [f for f in made if f not in reached]
        self._excluded.update(unreached)
        taken = [f for f in self._excluded if f in reached]
        self._excluded.difference_update(taken)
        for key, count in finding_counts(unreached).items():
            left = delta_counts.pop(key, 0) - count
            if left > 0:
                delta_counts[key] = left
            if not expected:
                self.tests.setdefault(key, []).append(nodeid)
        for key, count in finding_counts(taken).items():
            delta_counts[key] = delta_counts.get(key, 0) + count
        if expected:
            self.expected_findings.update(unreached)
        return delta_counts

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
            if event.recheck_status == "stale":
                stale.setdefault(key, event.recheck)
        # a worker that found the key stale is heard, whatever another one found after
        for key, line in stale.items():
            merged[key] = dataclasses.replace(merged[key], recheck=line,
                                              recheck_status="stale")
        return merged

    def stale_keys(self, events: Mapping[EventKey, DispatchEvent] | None = None
                   ) -> list[str]:
        """One line per key a recheck found stale: the key and what was found (of
        ``events``, :meth:`events` when not given)."""
        return [f"{'/'.join(key)}: {event.recheck}"
                for key, event in sorted((self.events() if events is None
                                          else events).items())
                if event.recheck_status == "stale"]

    def measured_entries(self) -> list[CacheEntry]:
        """The entries this run (and its workers) measured, not those it read."""
        if self.arbiter is None:
            return []
        cache = self.arbiter.cache
        changes = cache.changes()
        now = {key: cache.get(key) for key in changes}
        return [e for key, e in now.items() if e is not None and self._read(key, changes) is not e]

    def rechecks(self) -> list[tuple[KeyTuple, str, dict[str, LatencyStats]]]:
        """Each key this run (and its workers) re-timed with a result, once: the key,
        the cached winner and each candidate's statistics over the recheck's rounds."""
        merged = dict(self.worker_rechecks)
        if self.arbiter is not None:
            for key, result in list(self.arbiter.rechecks.items()):
                if result is not None and result.stats:
                    merged[tuple(key)] = (result.winner, dict(result.stats))
        return [(key, winner, stats) for key, (winner, stats) in sorted(merged.items())]

    def take_measured(self, entries: Iterable[CacheEntry]) -> None:
        """Add a worker's measured entries: they replace what the run read, and two
        workers' entries for one key resolve by the merge rule, not by who came last."""
        from pytest_arbiter.store.corpus import prefer

        assert self.arbiter is not None, "take_measured needs the run's arbiter"
        cache = self.arbiter.cache
        changes = cache.changes()
        taken: dict[KeyTuple, CacheEntry] = {}
        for entry in entries:
            held = taken.get(entry.key) or cache.get(entry.key)
            if held is not None and self._read(entry.key, changes) is not held:
                entry = prefer(held, entry)
            taken[entry.key] = entry
        cache.update(taken.values())  # one change: the plan tables are dropped once

    # -- a pytest-xdist worker's data -------------------------------------------------

    def payload(self) -> dict[str, Any]:
        """What a worker sends the controller: plain JSON values."""
        from pytest_arbiter.gating import histogram_file

        used = self.arbiter
        measured = None
        if used is not None:
            from pytest_arbiter.store.cache_file import document_builtins

            # only what this worker measured: the controller read the same cache file
            measured = document_builtins(self.measured_entries())
        found, reached = self.own_findings()
        kept = self._reasons()
        return {
            "histogram": histogram_file.payload(self.dispatch_counts()),
            "findings": [[*f, why, f in self.expected_findings, f in reached]
                         for f, why in found.items()],
            "expected": histogram_file.payload(self.expected.counts()),
            # None: this worker never dispatched, so it has nothing to add to the cache
            "cache": measured,
            "events": [dataclasses.asdict(e) for e in used.events.values()] if used else [],
            # a dict: execnet drops a Counter silently
            "refused": self.arbiter.record.refused_now() if self.arbiter is not None else {},
            "reasons": [[*key, [why, kept.severity[key]]]
                        for key, why in sorted(kept.text.items())],
            "evidence": {kind: sorted(map(list, found))
                         for kind, found in self.own_evidence().items()},
            "tests": [[*key, nodeids] for key, nodeids in sorted(self.tests.items())],
            "rechecks": [[*key, winner, {n: s.to_dict() for n, s in stats.items()}]
                         for key, winner, stats in self.rechecks()],
            "unavailable": [list(u) for u in unavailable_here(self.dispatch_counts())],
        }

    def absorb(self, name: str, payload: Any,
               take_measured: Callable[[list[CacheEntry]], None] | None = None) -> None:
        """Add worker ``name``'s :meth:`payload` (None: the worker crashed). A payload
        that cannot be read is an error of the run, never counts silently lost.
        ``take_measured``: what adds the worker's measured entries (default
        :meth:`take_measured`; the plugin's builds the run's arbiter first)."""
        from pytest_arbiter.gating import histogram_file

        if not isinstance(payload, dict):
            self.crashed.append(name)
            return
        try:
            self.worker_counts.append(histogram_file.counts_of(
                payload["histogram"], source=f"worker {name}")[0])
            self.worker_expected.append(histogram_file.counts_of(
                payload["expected"], source=f"worker {name}")[0])
            self._absorb_findings(payload.get("findings", []))
            self._absorb_evidence(payload.get("evidence", {}))
            refused = payload.get("refused", {})
            if not isinstance(refused, dict):
                raise ValueError(f"bad refused counts {refused!r}")
            self.worker_refused.update({str(kind): int(n) for kind, n in refused.items()})
            for key, (why, severity) in _keyed(payload.get("reasons", []), "reasons"):
                self.worker_reasons.keep(key, str(why), float(severity))
            for key, nodeids in _keyed(payload.get("tests", []), "tests"):
                self.tests.setdefault(key, []).extend(str(n) for n in nodeids)
            self._absorb_rechecks(payload.get("rechecks", []))
            self._absorb_unavailable(payload.get("unavailable", []))
            if payload["cache"] is not None:
                from pytest_arbiter.decision.selection import DispatchEvent
                from pytest_arbiter.store.cache_file import convert_document

                entries = convert_document(payload["cache"], source=f"worker {name}")
                (take_measured or self.take_measured)(entries)
                self.worker_events.extend(DispatchEvent(**e)
                                          for e in payload.get("events", []))
        except (KeyError, TypeError, ValueError) as exc:
            self.errors.append(f"worker {name} sent unreadable arbiter data: {exc}")


    def unavailable(self, counts: Mapping[HistogramKey, int]) -> list[Unavailable]:
        """The candidates of the dispatched ops that cannot run here: this process's
        and the workers'."""
        return sorted({*unavailable_here(counts), *self.worker_unavailable})

    def _absorb_unavailable(self, rows: Any) -> None:
        for row in rows:
            if (not isinstance(row, list) or len(row) != 5 or not isinstance(row[3], int)
                    or not all(isinstance(row[i], str) for i in (0, 1, 2, 4))):
                raise ValueError(f"bad unavailable row {row!r}")
            self.worker_unavailable.add(Unavailable(row[0], row[1], row[2], row[3], row[4]))

    def _absorb_rechecks(self, rows: Any) -> None:
        from pytest_arbiter.timing.measure import LatencyStats

        for row in rows:
            if (not isinstance(row, list) or len(row) != 7
                    or not all(isinstance(part, str) for part in row[:6])
                    or not isinstance(row[6], dict)):
                raise ValueError(f"bad rechecks row {row!r}")
            key: KeyTuple = (row[0], row[1], row[2], row[3], row[4])
            stats = {str(name): LatencyStats.from_dict(s) for name, s in row[6].items()}
            self.worker_rechecks.setdefault(key, (row[5], stats))

    def _absorb_evidence(self, sent: Any) -> None:
        if not isinstance(sent, dict):
            raise ValueError(f"bad evidence {sent!r}")
        for kind, found in self.worker_evidence.items():
            for row in sent.get(kind, []):
                if (not isinstance(row, list) or len(row) != 3
                        or not all(isinstance(part, str) for part in row)):
                    raise ValueError(f"bad evidence row {row!r}")
                found.add((row[0], row[1], row[2]))

    def _absorb_findings(self, rows: Any) -> None:
        for row in rows:
            if (not isinstance(row, list) or len(row) != 9
                    or not all(isinstance(part, str) for part in row[:7])
                    or row[5] not in OUTCOMES
                    or not all(isinstance(flag, bool) for flag in row[7:])):
                raise ValueError(f"bad findings row {row!r}")
            found: FindingKey = tuple(row[:6])
            self.worker_findings.setdefault(found, row[6])
            if row[7]:
                self.expected_findings.add(found)
            if row[8]:
                self.worker_reached.add(found)


def _keyed(rows: Any, what: str) -> list[tuple[HistogramKey, Any]]:
    """``[[target, op, selected, outcome, value], ...]`` from a worker, checked."""
    out = []
    for row in rows:
        if (not isinstance(row, list) or len(row) != 5
                or not all(isinstance(part, str) for part in row[:4])):
            raise ValueError(f"bad {what} row {row!r}")
        out.append((HistogramKey(row[0], row[1], row[2], row[3]), row[4]))
    return out


class Unavailable(NamedTuple):
    """A candidate of a dispatched op that cannot run on this machine, and why."""

    target: str
    op: str
    name: str
    tier: int
    reason: str


def unavailable_here(counts: Mapping[HistogramKey, int]) -> list[Unavailable]:
    """The candidates of each target and op this run dispatched that cannot run on this
    machine (a missing package, a device it lacks), with their ``available()`` reason:
    never timed nor run here, whatever their tier, so a reader is told."""
    from pytest_arbiter.core.candidates import REGISTRY

    found = []
    for target, op in sorted({(k.target, k.op) for k in counts}):
        for cand in REGISTRY.for_op(op, target):
            try:
                reason = cand.unavailable_reason()
            except Exception as exc:  # the dispatch said so too; the summary never raises
                reason = f"available() raised {type(exc).__name__}: {exc}"
            if reason is not None:
                found.append(Unavailable(target, op, cand.name, cand.tier, reason))
    return found
