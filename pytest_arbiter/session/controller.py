"""The controlling process's end of a run, without pytest: the artifacts the options
name are written from the run's ledger, and the verdict is taken.

Nothing a run measured or counted is lost on the way out: a run whose counts are
incomplete (a crashed worker, an interrupted session) writes no histogram or baseline
and says so; a baseline written from a partial run keeps the entries it could not check;
measured entries that cannot be merged into the cache go to a side shard beside it,
with the command that folds them in (docs/artifacts.md).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.gating.baseline import failing_outcomes, gate_fleet
from pytest_arbiter.gating.histogram import HistogramKey
from pytest_arbiter.session.summary import RunVerdict
from pytest_arbiter.store.safetext import counted

if TYPE_CHECKING:
    from pytest_arbiter.gating.completeness import RunScope
    from pytest_arbiter.session.ledger import RunLedger
    from pytest_arbiter.session.settings import ArbiterSettings
    from pytest_arbiter.store.artifacts import AsRead
    from pytest_arbiter.store.cache import CacheEntry


class Controller:
    """Writes a run's artifacts and takes its verdict (see the module)."""

    def __init__(self, settings: ArbiterSettings, ledger: RunLedger,
                 baseline: Mapping[HistogramKey, int],
                 as_read: AsRead | None = None) -> None:
        self.settings = settings
        self.ledger = ledger
        self.baseline = baseline
        self.as_read = as_read
        """The cache file as the run read it: a tuning run's write stands on it while the
        file is unchanged, instead of reading it again, and encodes only the changed
        keys."""

    def finish(self, scope: RunScope) -> RunVerdict:
        """Write what the options ask for, as far as ``scope`` allows; the verdict."""
        s, ledger = self.settings, self.ledger
        counts = ledger.counts()
        written = False
        if scope.collect_only:
            if any(p is not None for p in (s.histogram, s.write_baseline)) or s.tune:
                ledger.notes.append("collect-only run: no artifact written")
        elif scope.incomplete:
            why = "; ".join(scope.incomplete)
            for flag, path in (("--arbiter-histogram", s.histogram),
                               ("--arbiter-write-baseline", s.write_baseline)):
                if path is not None:
                    ledger.notes.append(f"{flag} {path} not written: the run's counts are "
                                        f"incomplete ({why})")
        else:
            if s.histogram is not None:
                from pytest_arbiter.gating import histogram_file  # only when written

                expected, target = ledger.expected_counts(), s.histogram
                self._write("--arbiter-histogram", lambda: histogram_file.write_histogram(
                    target, counts, expected))
            if s.write_baseline is not None:
                written = self._write_baseline(s.write_baseline, counts, scope)
        if s.tune and s.cache is not None and not scope.collect_only:
            # only what this run measured goes into the file, merged with what it holds
            # now: nothing measured leaves the file alone (a re-read copy of the old
            # entries would bring back ones deleted in the meantime, and the write of a
            # large corpus costs seconds)
            measured = ledger.measured_entries()
            if measured:
                self._write_measured(s.cache, measured)
        elif s.tune and not scope.collect_only:
            unwritten = len(ledger.measured_entries())
            if unwritten:
                kept = counted(unwritten, "measured entry", "measured entries")
                ledger.notes.append(f"--arbiter-tune without --arbiter-cache: {kept} kept "
                                    "in memory only, not written (pass --arbiter-cache=PATH)")
        failing = failing_outcomes(stale=s.recheck == "fail")
        # a baseline entry counts as fixed only if this run dispatched its target and op
        fleet = gate_fleet(ledger.gated_counts(), self.baseline, failing=failing,
                           evidence=ledger.evidence(), dispatched=counts)
        return RunVerdict(fleet.verdict, fleet.unchecked, failing, written, scope.incomplete)

    def _write(self, what: str, write: Callable[[], None]) -> None:
        """``write()``, an error naming ``what`` (and the file) on failure."""
        try:
            write()
        except ArtifactError as exc:
            self.ledger.errors.append(f"{what}: {exc}")

    def _write_baseline(self, path: Path, counts: dict[HistogramKey, int],
                        scope: RunScope) -> bool:
        """Write the baseline, keeping the old entries this run could not check; whether
        it was written."""
        from pytest_arbiter.gating import histogram_file
        from pytest_arbiter.gating.completeness import baseline_to_write

        try:
            old = histogram_file.read_histogram(path) if path.exists() else {}
        except ArtifactError as exc:
            self.ledger.errors.append(f"--arbiter-write-baseline: not written, the current "
                                      f"file is unreadable: {exc}")
            return False
        # what unmarked tests did: an on-purpose degrade must not make a real one known
        new, kept = baseline_to_write(self.ledger.gated_counts(), old, scope,
                                      dispatched=counts)
        errors = len(self.ledger.errors)
        self._write("--arbiter-write-baseline",
                    lambda: histogram_file.write_histogram(path, new))
        if len(self.ledger.errors) > errors:
            return False
        if kept:
            why = "; ".join(scope.partial) if scope.partial else "their target and op " \
                "were not dispatched"
            self.ledger.notes.append(f"--arbiter-write-baseline {path}: kept {len(kept)} "
                                     f"entries this run could not check ({why})")
        return True

    def _write_measured(self, path: Path, measured: list[CacheEntry]) -> None:
        """Merge the measured entries into the cache; if that fails, into a side shard
        beside it, with the command that folds it in: a measurement is never lost."""
        from pytest_arbiter.store import artifacts
        from pytest_arbiter.store.cache import MeasureCache

        try:
            artifacts.update_cache(path, measured, timeout=artifacts.LOCK_TIMEOUT_S,
                                   known=self.as_read, measured_now=True)
            return
        except ArtifactError as exc:
            failure = str(exc)
        shard = path.with_name(f"{path.stem}.shard-{socket.gethostname()}-{os.getpid()}-"
                               f"{int(time.time())}{path.suffix or '.json'}")
        errors = self.ledger.errors
        try:
            artifacts.write_cache(shard, MeasureCache(measured))
        except ArtifactError as exc:
            errors.append(f"--arbiter-cache: {failure}; the {len(measured)} measured "
                          f"entries could not be saved either: {exc}")
            return
        errors.append(
            f"--arbiter-cache: {failure}; the {len(measured)} measured entries were saved "
            f"to {shard}: fold them in with: pytest-arbiter merge -o {path} {shard}")
