"""What an arbiter records: the dispatch counts, the worst reason behind each entry, and
the findings of measurements and replays.

The counting rule (docs/contract.md, "Counting"): every dispatch counts once, under the
outcome it had. A failing kernel (``rejected`` or ``error``) that a measurement or a
replay of the corpus found for a key counts once per key and run, unless a dispatch of
the run reached it: then that dispatch is what counts. A recheck's ``stale`` finding
counts once per key and run. Findings are kept with their
key and whether a dispatch reached them, so the controller of an xdist run counts a key
that two workers found once, and one a worker's dispatch reached not at all.
"""

from __future__ import annotations

import collections
import sys
import threading

from pytest_arbiter.decision.states import DispatchKey
from pytest_arbiter.gating.histogram import (
    DispatchHistogram,
    FindingKey,
    HistogramKey,
    Outcome,
    Reasons,
)

REFERENCE_SEVERITY = sys.float_info.max
"""The severity of a reason whose dispatch fell to the reference, never timed: the
slowest there is (the largest float, not infinity: a worker sends it as JSON)."""


class Record:
    """Counts, reasons and findings of one process.

    The histogram holds every dispatch and every finding no dispatch has reached yet: a
    dispatch that reaches a finding's kernel takes its place (it is not counted twice).
    """

    def __init__(self, histogram: DispatchHistogram) -> None:
        self.histogram = histogram
        self.kept = Reasons()
        """Why each degraded, rejected, error and no_candidate entry happened: the
        decline's reason, the gate's report line, the exception."""
        self.findings: dict[FindingKey, str] = {}
        """The findings of this process, in the order found, with their reasons."""
        self.reached: set[FindingKey] = set()
        """The findings a dispatch of this process reached."""
        self.refused: collections.Counter[str] = collections.Counter()
        """Strict mode's refused dispatches, by what was refused (``CacheMiss.kind``)."""
        self._lock = threading.Lock()

    @property
    def reasons(self) -> dict[HistogramKey, str]:
        """The kept reason of each entry (:class:`Reasons`)."""
        return self.kept.text

    def keep(self, key: HistogramKey, reason: str, severity: float = 0.0) -> None:
        """:meth:`Reasons.keep`, under the lock (dispatching threads record at once)."""
        with self._lock:
            self.kept.keep(key, reason, severity)

    def reasons_now(self) -> Reasons:
        """The kept reasons, copied under the lock (a dispatching thread may be
        recording)."""
        with self._lock:
            copied = Reasons()
            copied.take(self.kept)
            return copied

    def refused_now(self) -> dict[str, int]:
        """The strict-mode refusals, copied under the lock."""
        with self._lock:
            return dict(self.refused)

    def refuse(self, kind: str) -> None:
        """Count one dispatch strict mode refused (``CacheMiss.kind``)."""
        with self._lock:
            self.refused[kind] += 1

    def add(self, key: HistogramKey, reason: str, at: DispatchKey | None = None,
            severity: float = 0.0) -> None:
        """Count one dispatch of ``key`` (of dispatch key ``at``); :meth:`keep` its
        reason. The first dispatch to reach a found kernel takes its count."""
        self.keep(key, reason, severity)
        if at is not None and key.outcome in ("rejected", "error"):
            found: FindingKey = (*at, key.selected, key.outcome)
            with self._lock:
                if found in self.findings and found not in self.reached:
                    self.reached.add(found)
                    return
        self.histogram.add(key)

    def note(self, key: HistogramKey, reason: str, severity: float = 0.0) -> None:
        """:meth:`keep` ``reason`` for ``key`` (nothing counted)."""
        self.keep(key, reason, severity)

    def finding(self, at: DispatchKey, name: str, outcome: Outcome, reason: str) -> None:
        """Count a failing kernel found for ``at``: once per key in the process."""
        found: FindingKey = (*at, name, outcome)
        with self._lock:
            if found in self.findings:
                return
            self.findings[found] = reason
        self.keep(HistogramKey(at.target, at.op, name, outcome), reason)
        self.histogram.add(HistogramKey(at.target, at.op, name, outcome))

    def snapshot(self) -> tuple[dict[FindingKey, str], set[FindingKey]]:
        """The findings and the reached ones, copied under the lock (another thread
        may be adding one)."""
        with self._lock:
            return dict(self.findings), set(self.reached)
