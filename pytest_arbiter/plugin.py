"""The pytest plugin: options, markers, the ``arbiter`` fixture and the degrade gate.

This module only wires pytest to plain objects. ``pytest_configure`` resolves the
settings, builds an :class:`ArbiterSession` and registers it as a plugin; its methods
are the hook implementations. State lives in ``config.stash`` under :data:`SESSION_KEY`.

Every dispatch of the process goes through the run's arbiter: the plugin binds
``pytest_arbiter.dispatch`` (and ``run_arbitrated``, ``default_arbiter()``) to it from
configure to unconfigure, so a kernel library's calls are gated and counted like the
fixture's. A run that never dispatches must cost next to nothing, so the arbiter, the
kernels and NumPy are imported at the first dispatch (or when an artifact option needs
them), not when pytest loads the plugin.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from pytest_arbiter import process
from pytest_arbiter.baseline import BaselineVerdict, gate_fleet
from pytest_arbiter.device import device_tag, forget, worker_device_environment
from pytest_arbiter.histogram import (
    GATED_OUTCOMES,
    OUTCOMES,
    STALE,
    DispatchHistogram,
    HistogramKey,
    merge_counts,
)
from pytest_arbiter.safetext import line as safe_line
from pytest_arbiter.settings import ArbiterSettings, add_options, resolve

if TYPE_CHECKING:
    from pytest_arbiter.arbiter import Arbiter, DispatchEvent
    from pytest_arbiter.artifacts import Stamp
    from pytest_arbiter.cache import CacheEntry, CacheKey, MeasureCache
    from pytest_arbiter.completeness import RunScope
    from pytest_arbiter.fixture import ArbiterFixture

DEVICE_TARGETS = ("cpu", "nvidia", "amd")

MARKERS = (
    "host_free: runs with no accelerator at all; every CPU CI runner runs it",
    "sm120: needs an NVIDIA sm_120 device (skipped elsewhere with the reason)",
    "arbiter_device(*tags): needs one of the device tags, e.g. "
    "arbiter_device('sm_90', 'gfx1151') or arbiter_device('cpu'); skipped with the reason "
    "when none is present",
    "arbiter_expect_degrade: the test provokes a degrade on purpose; its dispatch "
    "histogram entries do not count against the gate",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("arbiter", "pytest-arbiter: kernel arbitration and degrade gate")
    add_options(group.addoption, parser.addini)


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    ini_dir = config.inipath.parent if config.inipath is not None else config.rootpath
    try:
        settings = resolve(config.getoption, config.getini, ini_dir,
                           config.invocation_params.dir)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    _check_strict(settings)
    _check_writable(settings)
    if settings.worker_devices:
        _pin_worker_device(config, settings.worker_devices)
    session = ArbiterSession(config, settings)
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, "arbiter-session")
    process.bind(session.factory)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(session), "arbiter-xdist")


def _check_strict(settings: ArbiterSettings) -> None:
    """``--arbiter-strict`` replays a committed corpus: it needs one, and cannot tune."""
    if not settings.strict:
        return
    if settings.tune:
        raise pytest.UsageError("--arbiter-strict and --arbiter-tune cannot be combined: "
                                "strict replays the committed corpus and fails on a miss, "
                                "tune measures the misses")
    if settings.cache is None:
        raise pytest.UsageError("--arbiter-strict needs the corpus to replay: give "
                                "--arbiter-cache=PATH (or the ini key arbiter_cache)")
    if not settings.cache.is_file():
        raise pytest.UsageError(f"--arbiter-strict: the corpus {settings.cache} does not "
                                "exist (a typo in the path? create it with --arbiter-tune)")


def _check_writable(settings: ArbiterSettings) -> None:
    """Every artifact path the options name can be written: a usage error before any
    test runs, not a lost run after all of them."""
    from pytest_arbiter.completeness import unwritable

    for flag, path in (("--arbiter-histogram", settings.histogram),
                       ("--arbiter-write-baseline", settings.write_baseline),
                       ("--arbiter-cache", settings.cache if settings.tune else None)):
        why = unwritable(path) if path is not None else None
        if why is not None:
            raise pytest.UsageError(f"{flag}: cannot write {path}: {why}")


def _pin_worker_device(config: pytest.Config, devices: tuple[str, ...]) -> None:
    """On an xdist worker, make only its own GPU visible (before any GPU call)."""
    worker = getattr(config, "workerinput", None)
    try:
        env = worker_device_environment(worker["workerid"] if worker else "gw0", devices)
    except ValueError as exc:
        raise pytest.UsageError(f"--arbiter-worker-devices: {exc}") from None
    if worker is not None:
        os.environ.update(env)
        forget()


def _read_cache(path: Path | None) -> tuple[MeasureCache | None, Stamp | None]:
    """The cache at ``path`` (None if there is none), and its file's stamp."""
    if path is None or not path.exists():
        return None, None
    from pytest_arbiter import artifacts

    try:
        return artifacts.read_cache_stamped(path)
    except artifacts.ArtifactError as exc:
        raise pytest.UsageError(f"--arbiter-cache: cannot use {path}: {exc}") from None


def _cache_note(settings: ArbiterSettings, read: MeasureCache | None) -> str | None:
    path = settings.cache
    if path is None:
        return None
    if read is not None:
        return f"cache {path}: {len(read)} entries read"
    if settings.tune:
        return f"cache {path} does not exist yet: this run creates it"
    return (f"cache {path} does not exist: every key falls to the static tier order "
            "(a typo in the path? tune with --arbiter-tune to create it)")


def _read_baseline(path: Path | None) -> tuple[dict[HistogramKey, int], str]:
    if path is None:
        return {}, "no --arbiter-baseline given: every degraded entry is new"
    if not path.exists():
        return {}, f"baseline {path} does not exist yet: it counts as empty"
    from pytest_arbiter import artifacts

    try:
        return artifacts.read_histogram(path), f"baseline {path}"
    except artifacts.ArtifactError as exc:
        raise pytest.UsageError(f"--arbiter-baseline: cannot use {path}: {exc}") from None


def present_device_tags() -> set[str]:
    """The device tags of this machine, plus the plain target name of each present one."""
    import pytest_arbiter.runtime  # noqa: F401  the GPU lanes register their device probes

    tags: set[str] = set()
    for target in DEVICE_TARGETS:
        tag = device_tag(target)
        if tag is not None:
            tags.update((tag, target))
    return tags


def _tag_present(wanted: str, present: Iterable[str]) -> bool:
    return any(tag == wanted or tag.startswith(wanted + "-") for tag in present)


def _junit_log(config: pytest.Config) -> Any:
    """pytest's JUnit XML writer of this run (``--junitxml``), or None."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # pragma: no cover - pytest moved it: no suite totals then
        return None
    return config.stash.get(xml_key, None)


def _property_name(key: HistogramKey) -> str:
    return "arbiter:" + "/".join(key)


def _key_text(key: HistogramKey) -> str:
    return "/".join(key)


MAX_TESTS_SHOWN = 5


class ArbiterSession:
    """One run's arbiter, per-test attribution, expected-degrade log and gate; its
    methods are pytest hooks."""

    def __init__(self, config: pytest.Config, settings: ArbiterSettings) -> None:
        self.config = config
        self.settings = settings
        self.is_worker = hasattr(config, "workerinput")
        # the baseline first: once the cache is read, nothing here raises
        self.baseline, self.baseline_note = _read_baseline(settings.baseline)
        self.loaded_cache, stamp = _read_cache(settings.cache)
        # the entries as read, for the tuning run's write to stand for the file while it
        # is unchanged (the arbiter adds to loaded_cache as it measures)
        self._as_read: tuple[Stamp, MeasureCache] | None = None
        read = self.loaded_cache
        if settings.tune and not self.is_worker and stamp is not None and read is not None:
            self._as_read = (stamp, type(read).of_keyed(read.by_key()))
        self.cache_note = _cache_note(settings, self.loaded_cache)
        self._ended = False
        self.histogram = DispatchHistogram()
        self._arbiter: Arbiter | None = None
        self._read_entries: dict[CacheKey, CacheEntry] = {}
        self.expected = DispatchHistogram()
        self.tests: dict[HistogramKey, list[str]] = {}
        """The tests behind each entry (in the order they ran)."""
        self.worker_counts: list[dict[HistogramKey, int]] = []
        self.worker_expected: list[dict[HistogramKey, int]] = []
        self.worker_events: list[DispatchEvent] = []
        self.worker_reasons: dict[HistogramKey, str] = {}
        self.crashed_nodes: list[str] = []
        self.errors: list[str] = []
        self.verdict: BaselineVerdict | None = None
        self.unchecked: list[HistogramKey] = []
        self._before: dict[HistogramKey, int] | None = None
        self._expect: set[str] = set()
        self._missing_device: dict[str, str] = {}
        self.junit_recorded: dict[HistogramKey, int] = {}
        """The ``arbiter:`` counts the JUnit report's testcases hold (controller only)."""
        self._deselected = 0
        self.notes: list[str] = []
        """What the session end did with the artifacts, for the summary."""
        self.factory: Callable[[], Arbiter] = self._get_arbiter
        """What the process arbiter is bound to (one object, so unbind finds it)."""

    def _get_arbiter(self) -> Arbiter:
        return self.arbiter

    @property
    def arbiter(self) -> Arbiter:
        """The run's arbiter, built (and the kernels imported) on first use."""
        if self._ended:
            raise RuntimeError("the pytest-arbiter session has ended (pytest_unconfigure): "
                               "its arbiter and cache are gone")
        if self._arbiter is None:
            from pytest_arbiter.arbiter import Arbiter
            from pytest_arbiter.cache import MeasureCache
            from pytest_arbiter.candidates import REGISTRY

            cache = self.loaded_cache if self.loaded_cache is not None else MeasureCache()
            self._read_entries = cache.by_key()
            s = self.settings
            recheck, budget = None, None
            if s.recheck != "off":
                from pytest_arbiter.recheck import RecheckPolicy, RunBudget

                recheck = RecheckPolicy(
                    key_budget_s=s.recheck_key_budget or RecheckPolicy.key_budget_s,
                    call_timeout_s=s.call_timeout)
                budget = RunBudget(s.recheck_budget) if s.recheck_budget else None
            self._arbiter = Arbiter(registry=REGISTRY, cache=cache, mode=s.mode,
                                    histogram=self.histogram, gate=True,
                                    call_timeout_s=s.call_timeout, recheck=recheck,
                                    recheck_budget=budget)
        return self._arbiter

    def measured_entries(self) -> list[CacheEntry]:
        """The entries this run (and its workers) measured, not those it read."""
        if self._arbiter is None:
            return []
        read = self._read_entries
        return [e for key, e in self._arbiter.cache.by_key().items() if read.get(key) is not e]

    def take_measured(self, entries: Iterable[CacheEntry]) -> None:
        """Add a worker's measured entries: they replace what the run read, and two
        workers' entries for one key resolve by the merge rule, not by who came last."""
        from pytest_arbiter.corpus import prefer

        cache = self.arbiter.cache
        read = self._read_entries
        for entry in entries:
            held = cache.get(entry.key)
            if held is not None and read.get(entry.key) is not held:
                entry = prefer(held, entry)
            cache.put(entry)

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

    @property
    def failing(self) -> tuple[str, ...]:
        """The outcomes that fail the run unless the baseline lists them."""
        return GATED_OUTCOMES + ((STALE,) if self.settings.recheck == "fail" else ())

    def reasons(self) -> dict[HistogramKey, str]:
        """Why each failing entry happened: this process's first reason, else a worker's."""
        own = self._arbiter.reasons if self._arbiter is not None else {}
        return {**self.worker_reasons, **own}

    # -- per test ---------------------------------------------------------------------

    def fixture_for(self, item: pytest.Item) -> ArbiterFixture:
        from pytest_arbiter.fixture import ArbiterFixture

        nodeid = item.nodeid
        return ArbiterFixture(self.arbiter, fail=pytest.fail, skip=pytest.skip,
                              expect_degrade=lambda: self._expect.add(nodeid))

    # Every dispatch while a test runs (setup, call or teardown; the fixture, library
    # code, anything) belongs to that test: the counts are snapshot when it starts and
    # compared just before its teardown report is made. Until something dispatched,
    # there is no arbiter and both hooks return at once.

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._before = self.histogram.counts() if self._arbiter is not None else None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> None:
        if call.when == "teardown" and self._arbiter is not None:
            self.end_test(item)

    def end_test(self, item: pytest.Item) -> None:
        """Record what ``item`` dispatched: JUnit properties, its name per entry, and
        its entries as expected when it degrades on purpose."""
        nodeid = item.nodeid
        expected = nodeid in self._expect or (
            item.get_closest_marker("arbiter_expect_degrade") is not None)
        self._expect.discard(nodeid)
        before = self._before or {}
        self._before = None
        delta = self.histogram.minus(before)
        for key, count in sorted(delta.items()):
            item.user_properties.append((_property_name(key), count))
            self.tests.setdefault(key, []).append(nodeid)
        if expected and delta:
            self.expected.merge(delta)
            # so that `pytest-arbiter gate` on the JUnit file leaves them out too
            from pytest_arbiter.junit import EXPECT_DEGRADE_PROPERTY

            item.user_properties.append((EXPECT_DEGRADE_PROPERTY, 1))

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self._deselected += len(items)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        process.started(self.factory)

    def scope(self, session: pytest.Session, exitstatus: int | None = None) -> RunScope:
        """What this run covered (see :mod:`pytest_arbiter.completeness`)."""
        from pytest_arbiter.completeness import RunScope

        option = self.config.option
        partial = []
        if self._deselected:
            partial.append(f"{self._deselected} tests deselected")
        if self.config.args_source == pytest.Config.ArgsSource.ARGS:
            partial.append("test paths given on the command line")
        if getattr(option, "lf", False):
            partial.append("--lf")
        if session.shouldstop or session.shouldfail:
            partial.append("stopped early")
        incomplete = [f"worker {name} crashed" for name in self.crashed_nodes]
        status = exitstatus if exitstatus is not None else getattr(session, "exitstatus", None)
        if status == pytest.ExitCode.INTERRUPTED:
            incomplete.append("the session was interrupted")
        return RunScope(tuple(partial), tuple(incomplete),
                        bool(getattr(option, "collectonly", False)))

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        present: set[str] | None = None
        for item in items:
            needed: list[str] = []
            sm120 = False
            for mark in item.iter_markers():  # one walk up the node chain per item
                if mark.name == "arbiter_device":
                    needed.extend(str(tag) for tag in mark.args)
                elif mark.name == "sm120":
                    sm120 = True
            if sm120:
                needed.append("sm_120")
            if not needed:
                continue
            if present is None:
                present = present_device_tags()
            if any(_tag_present(tag, present) for tag in needed):
                continue
            found = ", ".join(sorted(present)) or "none"
            reason = (f"needs device {' or '.join(repr(t) for t in needed)}; "
                      f"found device tags: {found}")
            if self.settings.no_skip:
                self._missing_device[item.nodeid] = reason
            else:
                item.add_marker(pytest.mark.skip(reason=reason))
        if self._missing_device and not self.config.pluginmanager.has_plugin(
                "arbiter-no-skip"):
            # a per-test hook only when some test needs it
            self.config.pluginmanager.register(_NoSkipHooks(self._missing_device),
                                               "arbiter-no-skip")

    def pytest_make_parametrize_id(self, config: pytest.Config, val: object,
                                   argname: str) -> str | None:
        # a GateCase exists only once its module was imported: don't import it for this
        fixture_module = sys.modules.get("pytest_arbiter.fixture")
        if fixture_module is not None and isinstance(val, fixture_module.GateCase):
            return str(val.id)
        return None

    # -- session end ------------------------------------------------------------------

    def _write(self, what: str, path: Path, write: Callable[[ModuleType, Path], None]
               ) -> None:
        """``write(artifacts, path)``, an error naming ``what`` and ``path`` on failure."""
        from pytest_arbiter import artifacts  # only when an artifact is to be written

        try:
            write(artifacts, path)
        except artifacts.ArtifactError as exc:
            self.errors.append(f"{what}: {exc}")

    def _write_baseline(self, path: Path, counts: dict[HistogramKey, int],
                        scope: RunScope) -> None:
        """Write the baseline, keeping the old entries this run could not check."""
        from pytest_arbiter import artifacts
        from pytest_arbiter.completeness import baseline_to_write

        try:
            old = artifacts.read_histogram(path) if path.exists() else {}
        except artifacts.ArtifactError as exc:
            self.errors.append(f"--arbiter-write-baseline: not written, the current file "
                               f"is unreadable: {exc}")
            return
        new, kept = baseline_to_write(counts, old, scope)
        self._write("--arbiter-write-baseline", path, lambda a, p: a.write_histogram(p, new))
        if kept:
            why = "; ".join(scope.partial) if scope.partial else "their target and op " \
                "were not dispatched"
            self.notes.append(f"--arbiter-write-baseline {path}: kept {len(kept)} entries "
                              f"this run could not check ({why})")

    def _write_measured(self, path: Path, measured: list[CacheEntry]) -> None:
        """Merge the measured entries into the cache; if that fails, into a side shard
        beside it, with the command that folds it in: a measurement is never lost."""
        from pytest_arbiter import artifacts
        from pytest_arbiter.cache import MeasureCache

        try:
            artifacts.update_cache(path, measured, timeout=artifacts.LOCK_TIMEOUT_S,
                                   known=self._as_read)
            return
        except artifacts.ArtifactError as exc:
            failure = str(exc)
        shard = path.with_name(f"{path.stem}.shard-{socket.gethostname()}-{os.getpid()}-"
                               f"{int(time.time())}{path.suffix or '.json'}")
        try:
            artifacts.write_cache(shard, MeasureCache(measured))
        except artifacts.ArtifactError as exc:
            self.errors.append(f"--arbiter-cache: {failure}; the {len(measured)} measured "
                               f"entries could not be saved either: {exc}")
            return
        self.errors.append(
            f"--arbiter-cache: {failure}; the {len(measured)} measured entries were saved "
            f"to {shard}: fold them in with: pytest-arbiter merge -o {path} {shard}")

    def _fail_run(self, session: pytest.Session) -> None:
        if getattr(session, "exitstatus", None) in (pytest.ExitCode.OK,
                                                    pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        process.finished(self.factory)
        if self.is_worker:
            self._fill_workeroutput()
            return
        s = self.settings
        counts = self.counts()
        scope = self.scope(session, exitstatus)
        if scope.collect_only:
            if any(p is not None for p in (s.histogram, s.write_baseline)) or s.tune:
                self.notes.append("collect-only run: no artifact written")
        elif scope.incomplete:
            why = "; ".join(scope.incomplete)
            for flag, path in (("--arbiter-histogram", s.histogram),
                               ("--arbiter-write-baseline", s.write_baseline)):
                if path is not None:
                    self.notes.append(f"{flag} {path} not written: the run's counts are "
                                      f"incomplete ({why})")
        else:
            if s.histogram is not None:
                expected = self.expected_counts()
                self._write("--arbiter-histogram", s.histogram,
                            lambda a, p: a.write_histogram(p, counts, expected))
            if s.write_baseline is not None:
                self._write_baseline(s.write_baseline, counts, scope)
        if s.tune and s.cache is not None and not scope.collect_only:
            # only what this run measured goes into the file, merged with what it holds
            # now: nothing measured leaves the file alone (a re-read copy of the old
            # entries would bring back ones deleted in the meantime, and the write of a
            # large corpus costs seconds)
            measured = self.measured_entries()
            if measured:
                self._write_measured(s.cache, measured)
        # a baseline entry counts as fixed only if this run dispatched its target and op
        fleet = gate_fleet(self.gated_counts(), self.baseline, failing=self.failing)
        self.verdict, self.unchecked = fleet.verdict, fleet.unchecked
        if self.errors or self.crashed_nodes:
            self._fail_run(session)
        elif not self.verdict.passed and s.write_baseline is None:
            self._fail_run(session)

    def _fill_workeroutput(self) -> None:
        output = getattr(self.config, "workeroutput", None)
        if output is None:
            return
        used = self._arbiter
        measured = None
        if used is not None:
            from pytest_arbiter.cache import MeasureCache

            # only what this worker measured: the controller read the same cache file
            measured = MeasureCache(self.measured_entries()).to_dict()
        output["arbiter"] = {
            "histogram": self.histogram.to_dict(),
            "expected": self.expected.to_dict(),
            # None: this worker never dispatched, so it has nothing to add to the cache
            "cache": measured,
            "events": [dataclasses.asdict(e) for e in used.events.values()] if used else [],
            "reasons": [[*key, why] for key, why in sorted(self.reasons().items())],
            "tests": [[*key, nodeids] for key, nodeids in sorted(self.tests.items())],
        }

    # -- the JUnit report's suite totals ------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # pytest's junitxml writes a testcase's properties from its teardown report; on
        # the controller this sees every worker's reports too
        if (report.when == "teardown" and report.user_properties and not self.is_worker
                and _junit_log(self.config) is not None):
            from pytest_arbiter.junit import add_recorded

            add_recorded(self.junit_recorded, report.user_properties)

    @pytest.hookimpl(tryfirst=True, specname="pytest_sessionfinish")
    def pytest_sessionfinish_junit_totals(self, session: pytest.Session,
                                          exitstatus: int) -> None:
        """Before pytest's junitxml writes the report (its own session-finish hook): the
        run's dispatch totals as suite properties, so that ``pytest-arbiter gate`` can
        tell a complete report from a damaged one (docs/artifacts.md)."""
        log = None if self.is_worker else _junit_log(self.config)
        if log is None:
            return
        from pytest_arbiter.junit import suite_properties

        for name, value in suite_properties(self.counts(), self.junit_recorded,
                                            self.scope(session, exitstatus).incomplete,
                                            self.stale_keys()):
            log.add_global_property(name, value)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        process.unbind(self.factory)
        # let the cache go before pytest's end-of-run garbage collections (five full
        # ones), each of which would otherwise walk every object of a large corpus;
        # emptied, not just dropped: the last failed test's traceback may still hold it
        self._ended = True
        for cache in (self.loaded_cache, self._arbiter.cache if self._arbiter else None):
            if cache is not None:
                cache.clear()
        self.loaded_cache = self._as_read = None
        self._arbiter = None
        self._read_entries = {}

    # -- reporting --------------------------------------------------------------------

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.is_worker:
            return
        lines = self.summary_lines()
        if not lines:
            return
        terminalreporter.write_sep("=", "arbiter")
        for line in lines:
            terminalreporter.write_line(line)

    def summary_lines(self) -> list[str]:
        lines: list[str] = []
        counts = self.counts()
        per: dict[tuple[str, str], dict[str, int]] = {}
        for (target, op, _sel, outcome), count in counts.items():
            row = per.setdefault((target, op), dict.fromkeys(OUTCOMES, 0))
            row[outcome] += count
        if per:
            lines.append("dispatch histogram (target/op: " + ", ".join(OUTCOMES) + "):")
            for (target, op), row in sorted(per.items()):
                lines.append(f"  {target}/{op}: " + ", ".join(
                    f"{name}={row[name]}" for name in OUTCOMES))
            for key, count in sorted(counts.items()):
                lines.append(f"    {_key_text(key)}: {count}")
        expected = self.expected_counts()
        if expected:
            lines.append("expected degrades (arbiter_expect_degrade, not gated): " + ", ".join(
                f"{_key_text(k)}={v}" for k, v in sorted(expected.items())))
        if self.cache_note is not None:
            lines.append(self.cache_note)
        sources = self._sources()
        if sources:
            lines.append("keys: " + ", ".join(
                f"{sum(1 for v in sources.values() if v == src)} {label}"
                for src, label in (("measured", "measured"), ("cached", "reused from cache"),
                                   ("static", "static tier order on a miss"))))
        lines.extend(self._stale_lines())
        lines.extend(self._recheck_lines())
        if self.settings.explain:
            lines.extend(self._explain_lines())
        else:
            lines.extend(self._winner_lines())
        for name in self.crashed_nodes:
            lines.append(f"worker {name} returned no arbiter data (crashed?): the run fails")
        lines.extend(self.notes)
        for error in self.errors:
            lines.append(f"artifact error: {error}")
        verdict = self.verdict
        if verdict is not None and (counts or verdict.fixed or self.settings.baseline):
            lines.append(self.baseline_note)
            lines.extend(self._new_entry_lines(verdict))
            lines.extend(verdict.describe_fixed())
            if self.unchecked:
                lines.append(f"{len(self.unchecked)} baseline entries not checked: this run "
                             "did not dispatch their target and op")
            if not verdict.passed:
                if self.settings.write_baseline is not None:
                    lines.append("new gated entries recorded by --arbiter-write-baseline "
                                 f"{self.settings.write_baseline}")
                else:
                    lines.append(f"degrade gate FAILED: new {_either(self.failing)} "
                                 "dispatch entries (fix the kernel, mark the test "
                                 "arbiter_expect_degrade, or add them to the baseline)")
                    if any(key[3] == STALE for key in verdict.new):
                        lines.append("stale cached winners: re-tune those keys "
                                     "(pytest --arbiter-tune --arbiter-recheck)")
            else:
                lines.append("degrade gate passed")
        # names come from registrations, worker payloads and artifacts: printed escaped
        return [safe_line(text) for text in lines]

    def _new_entry_lines(self, verdict: BaselineVerdict) -> list[str]:
        """Each new failing entry, its reason, and the tests behind it."""
        reasons = self.reasons()
        lines = []
        for line, key in zip(verdict.describe_new(), sorted(verdict.new), strict=True):
            lines.append(line)
            why = reasons.get(key)
            if why:
                lines.append(f"    reason: {why}")
            tests = self.tests.get(key, [])
            shown = ", ".join(dict.fromkeys(tests[:MAX_TESTS_SHOWN]))
            more = len(set(tests)) - len(set(tests[:MAX_TESTS_SHOWN]))
            lines.append("    tests: " + (shown or "none (dispatched outside any test)")
                         + (f" (+{more} more)" if more > 0 else ""))
        return lines

    def events(self) -> dict[tuple[str, ...], DispatchEvent]:
        """Dispatch events of this process and the workers; a measured one wins a key."""
        merged: dict[tuple[str, ...], DispatchEvent] = {}
        own = self._arbiter.events.values() if self._arbiter is not None else ()
        for event in [*self.worker_events, *own]:
            key = (event.target, event.op, event.bucket, event.dtype)
            previous = merged.get(key)
            if previous is None or previous.source != "measured":
                merged[key] = event
        return merged

    def _sources(self) -> dict[str, str]:
        return {"/".join(k): e.source for k, e in self.events().items()}

    def _winner_lines(self, most: int = 20) -> list[str]:
        picked = [(key, event) for key, event in sorted(self.events().items())
                  if event.order and event.source in ("measured", "cached")]
        if not picked:
            return []
        cached = self._cached_winners({key for key, _ in picked[:most]})
        lines = ["winners:"]
        for key, event in picked[:most]:
            how = "measured" if event.source == "measured" else "reused from cache"
            # the key's winner as cached; the last dispatch may have run another
            # candidate (the winner declined those inputs)
            winner = cached.get(key, event.order[0])
            ran = "" if winner == event.order[0] else f"; last dispatch ran {event.order[0]}"
            lines.append(f"  {'/'.join(key)}: {winner} ({how}{ran})")
        if len(picked) > most:
            lines.append(f"  ... and {len(picked) - most} more (--arbiter-explain lists them all)")
        return lines

    def _stale_lines(self, most: int = 20) -> list[str]:
        """The keys whose cache entries are out of date, by kind (docs/artifacts.md)."""
        by_kind: dict[str, list[tuple[str, str]]] = {}
        for key, event in sorted(self.events().items()):
            for kind, why in event.stale.items():
                by_kind.setdefault(kind, []).append(("/".join(key), why))
        lines: list[str] = []
        for kind, head in STALE_HEADS:
            found = by_kind.get(kind, [])
            if not found:
                continue
            lines.append(head.format(n=len(found), s="" if len(found) == 1 else "s"))
            lines.extend(f"  {key}: {why}" for key, why in found[:most])
            if len(found) > most:
                lines.append(f"  ... and {len(found) - most} more")
        return lines

    def stale_keys(self) -> list[str]:
        """One line per key a recheck found stale: the key and what was found."""
        return [f"{'/'.join(key)}: {event.recheck}"
                for key, event in sorted(self.events().items())
                if event.recheck.startswith("stale:")]

    def _recheck_lines(self) -> list[str]:
        if self.settings.recheck == "off":
            return []
        found = [e.recheck.split(":", 1)[0].split(" ", 1)[0]
                 for e in self.events().values() if e.recheck]
        kinds = {kind: found.count(kind) for kind in ("current", "stale", "no", "not")}
        lines = [f"recheck: {len(found) - kinds['not']} cached keys re-timed: "
                 f"{kinds['stale']} stale, {kinds['current']} current, "
                 f"{kinds['no']} without a verdict"
                 + (f"; {kinds['not']} not re-timed (the run's recheck budget was spent)"
                    if kinds["not"] else "")]
        lines.extend(f"  {line}" for line in self.stale_keys())
        if kinds["stale"] and self.settings.recheck != "fail":
            lines.append("  (report only: --arbiter-recheck=fail gates stale keys)")
        return lines

    def _cached_winners(self, keys: set[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
        """The cache's winner for each of ``keys`` (target, op, bucket, dtype), ``a@dev,
        b@dev`` when several devices hold the key."""
        if self._arbiter is None:
            return {}
        found: dict[tuple[str, ...], dict[str, str]] = {}
        for cache_key, entry in self._arbiter.cache.by_key().items():
            if cache_key[1:] in keys:
                found.setdefault(cache_key[1:], {})[entry.device] = entry.winner
        return {key: (next(iter(by_device.values())) if len(set(by_device.values())) == 1
                      else ", ".join(f"{w}@{d}" for d, w in sorted(by_device.items())))
                for key, by_device in found.items()}

    def _explain_lines(self) -> list[str]:
        lines = []
        for key, event in sorted(self.events().items()):
            picked = event.order[0] if event.order else "nothing (the reference ran)"
            lines.append(f"{'/'.join(key)} [{event.source}]: picked {picked}")
            for name in event.order[1:]:
                ratio = event.ratios.get(name)
                why = (f"slower by {(ratio - 1) * 100:.1f}%" if ratio is not None
                       else "lower in the order")
                lines.append(f"  passed over {name}: {why}")
            for name, why in sorted(event.passed_over.items()):
                lines.append(f"  passed over {name}: {why}")
        return lines


def _either(names: Sequence[str]) -> str:
    """``a, b or c``."""
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


STALE_HEADS = (
    ("winner-changed", "{n} key{s} whose cached winner changed code since it was measured: "
                       "the tier order ran (--arbiter-tune measures them again)"),
    ("unmeasured", "{n} key{s} with candidates that were never measured, or whose code "
                   "changed since (--arbiter-tune measures them; --arbiter-strict fails)"),
    ("reverify", "{n} key{s} measured under another environment: the next --arbiter-tune "
                 "re-times winner against runner-up"),
)


def _keyed(rows: Any, what: str) -> list[tuple[HistogramKey, Any]]:
    """``[[target, op, selected, outcome, value], ...]`` from a worker, checked."""
    out = []
    for row in rows:
        if (not isinstance(row, list) or len(row) != 5
                or not all(isinstance(part, str) for part in row[:4])):
            raise ValueError(f"bad {what} row {row!r}")
        out.append(((row[0], row[1], row[2], row[3]), row[4]))
    return out


class XdistHooks:
    """Controller-side xdist hooks: merge each worker's plain-dict payload."""

    def __init__(self, session: ArbiterSession) -> None:
        self.session = session

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        s = self.session
        output = getattr(node, "workeroutput", None)
        payload = output.get("arbiter") if isinstance(output, dict) else None
        gateway = getattr(node, "gateway", None)
        name = str(gateway.id if gateway is not None else node)
        if not isinstance(payload, dict):
            s.crashed_nodes.append(name)
            return
        try:
            s.worker_counts.append(DispatchHistogram.from_dict(
                payload["histogram"], source=f"worker {name}").counts())
            s.worker_expected.append(DispatchHistogram.from_dict(
                payload["expected"], source=f"worker {name}").counts())
            for key, why in _keyed(payload.get("reasons", []), "reasons"):
                s.worker_reasons.setdefault(key, str(why))
            for key, nodeids in _keyed(payload.get("tests", []), "tests"):
                s.tests.setdefault(key, []).extend(str(n) for n in nodeids)
            if payload["cache"] is not None:
                from pytest_arbiter.arbiter import DispatchEvent
                from pytest_arbiter.cache import MeasureCache

                s.take_measured(MeasureCache.from_dict(
                    payload["cache"], source=f"worker {name}").entries())
                s.worker_events.extend(DispatchEvent(**e) for e in payload.get("events", []))
        except (KeyError, TypeError, ValueError) as exc:
            s.errors.append(f"worker {name} sent unreadable arbiter data: {exc}")


SESSION_KEY = pytest.StashKey[ArbiterSession]()


class _NoSkipHooks:
    """``--arbiter-no-skip``: fail, at call time, the tests whose device is missing."""

    def __init__(self, missing: dict[str, str]) -> None:
        self.missing = missing

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        reason = self.missing.pop(item.nodeid, None)
        if reason is not None:
            pytest.fail(f"{reason} (--arbiter-no-skip: failing instead of skipping)",
                        pytrace=False)


@pytest.fixture
def arbiter(request: pytest.FixtureRequest) -> ArbiterFixture:
    """The run's arbiter: ``arbiter.dispatch(op, *inputs)``, ``arbiter.gate(name, *inputs)``.

    The same arbiter as ``pytest_arbiter.dispatch`` in this run; what the test
    dispatches becomes its JUnit properties (``arbiter:...``).
    """
    return request.config.stash[SESSION_KEY].fixture_for(request.node)
