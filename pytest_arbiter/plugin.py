"""The pytest plugin: options, markers, the ``arbiter`` fixture and the hooks.

This module only wires pytest to plain objects: ``pytest_configure`` resolves the
settings (:mod:`~pytest_arbiter.session.settings`), builds an :class:`ArbiterSession` (what
every process of a run has: the arbiter, per-test attribution, device skips) and
registers it with :class:`ControllerHooks` (the end of the run: the workers' data, the
artifacts through :class:`~pytest_arbiter.session.controller.Controller`, the verdict and the
summary of :mod:`~pytest_arbiter.session.summary`) or, in a pytest-xdist worker,
:class:`WorkerHooks` (its :class:`~pytest_arbiter.session.ledger.RunLedger` sent to the
controller). State lives in ``config.stash`` under :data:`SESSION_KEY`.

Every dispatch of the process goes through the run's arbiter: the plugin binds
``pytest_arbiter.dispatch`` (and ``run_arbitrated``, ``default_arbiter()``) to it from
configure to unconfigure, so a kernel library's calls are gated and counted like the
fixture's. A run that never dispatches must cost next to nothing, so the arbiter, the
kernels and NumPy are imported at the first dispatch (or when an artifact option needs
them), not when pytest loads the plugin.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_arbiter.decision import process
from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.extend import hooks
from pytest_arbiter.extend.backends import BACKENDS
from pytest_arbiter.extend.device import device_tag, forget, worker_device_environment
from pytest_arbiter.gating.histogram import DispatchHistogram, HistogramKey
from pytest_arbiter.session.controller import Controller
from pytest_arbiter.session.ledger import RunLedger
from pytest_arbiter.session.settings import ArbiterSettings, add_options, resolve, round_limit
from pytest_arbiter.session.summary import RunVerdict, render
from pytest_arbiter.store.safetext import counted, escape

if TYPE_CHECKING:
    from pytest_arbiter.decision.arbiter import Arbiter
    from pytest_arbiter.gating.completeness import RunScope
    from pytest_arbiter.session.fixture import ArbiterFixture
    from pytest_arbiter.session.signals import CancelGuard
    from pytest_arbiter.store.artifacts import AsRead
    from pytest_arbiter.store.cache import CacheEntry, MeasureCache

MARKERS = (
    "host_free: runs with no accelerator at all; every CPU CI runner runs it",
    "sm120: needs an NVIDIA sm_120 device (skipped elsewhere with the reason)",
    "arbiter_device(*tags): needs one of the device tags, e.g. "
    "arbiter_device('sm_90', 'gfx1151') or arbiter_device('cpu'); skipped with the reason "
    "when none is present",
    "arbiter_expect_degrade: the test provokes a degrade on purpose; its dispatch "
    "histogram entries do not count against the gate",
)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """The arbiter's hooks (:mod:`pytest_arbiter.extend.hookspecs`), so conftest files and
    plugins may implement them; :func:`pytest_arbiter.extend.hooks.relay_to` forwards to them."""
    from pytest_arbiter.extend import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


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
    ending = WorkerHooks(session) if session.is_worker else ControllerHooks(session)
    config.pluginmanager.register(ending, "arbiter-end")
    process.bind(session.factory)
    hooks.relay_to(config.hook)


def pytest_unconfigure(config: pytest.Config) -> None:
    hooks.stop_relay(config.hook)


def pytest_report_header(config: pytest.Config) -> str:
    s = config.stash[SESSION_KEY].settings
    tags = ", ".join(sorted(present_device_tags() - set(BACKENDS.targets()))) or "none"
    return (f"arbiter: devices {tags}; mode {s.mode}; cache {s.cache or 'none'}; "
            f"baseline {s.baseline or 'none'}")


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
        raise pytest.UsageError(f"--arbiter-strict: the corpus {escape(settings.cache)} does not "
                                "exist (a typo in the path? create it with --arbiter-tune)")


def _check_writable(settings: ArbiterSettings) -> None:
    """Every artifact path the options name can be written: a usage error before any
    test runs, not a lost run after all of them. A missing folder is created, as
    ``--junitxml`` creates its own."""
    from pytest_arbiter.gating.completeness import unwritable

    for flag, path in (("--arbiter-histogram", settings.histogram),
                       ("--arbiter-write-baseline", settings.write_baseline),
                       ("--arbiter-cache", settings.cache if settings.tune else None),
                       ("--arbiter-benchmark-json", settings.benchmark_json)):
        if path is None:
            continue
        with contextlib.suppress(OSError):  # unwritable() says why
            path.parent.mkdir(parents=True, exist_ok=True)
        why = unwritable(path)
        if why is not None:
            raise pytest.UsageError(f"{flag}: cannot write {escape(path)}: {escape(why)}")


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


def _read_cache(path: Path | None) -> tuple[MeasureCache | None, AsRead | None]:
    """The cache at ``path`` (None if there is none), and its file as read."""
    if path is None or not path.exists():
        return None, None
    from pytest_arbiter.store import artifacts

    try:
        return artifacts.read_cache_as_read(path)
    except ArtifactError as exc:
        raise pytest.UsageError(f"--arbiter-cache: cannot use {escape(path)}: {escape(exc)}"
                                ) from None


def _cache_note(settings: ArbiterSettings, read: MeasureCache | None) -> str | None:
    path = settings.cache
    if path is None:
        return None
    if read is not None:
        return f"cache {path}: {counted(len(read), 'entry', 'entries')} read"
    if settings.tune:
        return f"cache {path} does not exist yet: this run creates it"
    return (f"cache {path} does not exist: every key falls to the static tier order "
            "(a typo in the path? tune with --arbiter-tune to create it)")


def _read_baseline(path: Path | None, writes: Path | None
                   ) -> tuple[dict[HistogramKey, int], str]:
    if path is None and writes is not None:
        return {}, f"no --arbiter-baseline given: --arbiter-write-baseline {writes} records " \
                   "this run's entries"
    if path is None:
        return {}, ("no --arbiter-baseline given: every degraded, rejected or error entry "
                    "is new")
    if not path.exists():
        return {}, f"baseline {path} does not exist yet: it counts as empty"
    from pytest_arbiter.gating import histogram_file  # msgspec: only when there is one

    try:
        return histogram_file.read_histogram(path), f"baseline {path}"
    except ArtifactError as exc:
        raise pytest.UsageError(f"--arbiter-baseline: cannot use {escape(path)}: "
                                f"{escape(exc)}") from None


def present_device_tags() -> set[str]:
    """The device tags of this machine, plus the plain target name of each present one."""
    hooks.load_backends()
    tags: set[str] = set()
    for target in BACKENDS.targets():
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


class ArbiterSession:
    """What every pytest process of a run has: the run's arbiter (built at the first
    dispatch), its ledger, per-test attribution and device skips. Its methods are pytest
    hooks; the end of the run is :class:`ControllerHooks`' or :class:`WorkerHooks`'."""

    def __init__(self, config: pytest.Config, settings: ArbiterSettings) -> None:
        self.config = config
        self.settings = settings
        self.is_worker = hasattr(config, "workerinput")
        # the baseline first: once the cache is read, nothing here raises
        self.baseline, self.baseline_note = _read_baseline(settings.baseline,
                                                              settings.write_baseline)
        self.loaded_cache, as_read = _read_cache(settings.cache)
        # the entries as read, for the tuning run's write to stand for the file while it
        # is unchanged (the arbiter adds to loaded_cache as it measures)
        self.as_read: AsRead | None = None
        read = self.loaded_cache
        if settings.tune and not self.is_worker and as_read is not None and read is not None:
            self.as_read = as_read._replace(cache=read.copy())
        self.cache_note = _cache_note(settings, self.loaded_cache)
        self.ledger = RunLedger()
        self.end = RunVerdict()
        self._ended = False
        self._arbiter: Arbiter | None = None
        self._before: dict[HistogramKey, int] | None = None
        self._expect: set[str] = set()
        self._missing_device: dict[str, str] = {}
        self._deselected = 0
        self._guard: CancelGuard | None = None
        self.factory: Callable[[], Arbiter] = self.get_arbiter
        """What the process arbiter is bound to (one object, so unbind finds it)."""

    def get_arbiter(self) -> Arbiter:
        """The run's arbiter, built (and the kernels imported) on first use.

        A method, not a property: pytest 7.4 to 8.2 read every attribute of a registered
        plugin looking for fixtures, which would build it at configure time."""
        if self._ended:
            raise RuntimeError("the pytest-arbiter session has ended (pytest_unconfigure): "
                               "its arbiter and cache are gone")
        if self._arbiter is None:
            self._arbiter = _build_arbiter(self.settings, self.loaded_cache,
                                           self.ledger.histogram)
            self.ledger.use(self._arbiter)
        return self._arbiter

    def fixture_for(self, item: pytest.Item) -> ArbiterFixture:
        from pytest_arbiter.session.fixture import ArbiterFixture

        nodeid = item.nodeid
        return ArbiterFixture(self.get_arbiter(), fail=pytest.fail, skip=pytest.skip,
                              expect_degrade=lambda: self._expect.add(nodeid))

    # Every dispatch while a test runs (setup, call or teardown; the fixture, library
    # code, anything) belongs to that test: the counts are snapshot when it starts and
    # compared just before its teardown report is made. Until something dispatched,
    # there is no arbiter and both hooks return at once.

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._before = self.ledger.histogram.counts() if self._arbiter is not None else None

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
        once = "benchmark" in getattr(item, "fixturenames", ())
        delta = self.ledger.record_test(nodeid, before, expected, once=once)
        # a rerun (pytest-rerunfailures) records its own attempt, not the earlier ones too
        item.user_properties[:] = [p for p in item.user_properties
                                   if not str(p[0]).startswith(("arbiter:", "arbiter-"))]
        if not delta:
            return
        from pytest_arbiter.gating.junit import (
            EXPECT_DEGRADE_PROPERTY,
            REASON_OUTCOMES,
            REASON_PREFIX,
            TEST_PROPERTY,
            property_name,
            reason_text,
        )

        failing = [key for key, _ in delta if key.outcome in REASON_OUTCOMES]
        reasons = self.ledger.reasons() if failing else {}
        for key, count in delta:
            item.user_properties.append((property_name(key), count))
        for key in failing:  # what the summary says of the key: for people, never parsed
            why = reason_text(reasons.get(key, ""))
            if why.strip():
                item.user_properties.append((property_name(key, REASON_PREFIX), why))
        if failing:  # named by the gate as pytest takes it, not as JUnit's classname
            item.user_properties.append((TEST_PROPERTY, nodeid))
        if expected:
            # so that `pytest-arbiter gate` on the JUnit file leaves them out too
            item.user_properties.append((EXPECT_DEGRADE_PROPERTY, 1))

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self._deselected += len(items)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        process.started(self.factory)
        if self.settings.tune:  # a SIGTERM keeps what was measured, as Ctrl-C does
            from pytest_arbiter.session.signals import CancelGuard

            self._guard = CancelGuard.install(_xdist_stop(self.config),
                                              _say_now(self.config),
                                              worker=hasattr(self.config, "workerinput"))

    def scope(self, session: pytest.Session, exitstatus: int | None = None) -> RunScope:
        """What this run covered (see :mod:`pytest_arbiter.gating.completeness`)."""
        from pytest_arbiter.gating.completeness import RunScope

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
        incomplete = [f"worker {name} crashed" for name in self.ledger.crashed]
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
        fixture_module = sys.modules.get("pytest_arbiter.session.fixture")
        if fixture_module is not None and isinstance(val, fixture_module.GateCase):
            return str(val.id)
        return None

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        process.unbind(self.factory)
        if self._guard is not None:
            self._guard.uninstall()
        # let the cache go before pytest's end-of-run garbage collections (five full
        # ones), each of which would otherwise walk every object of a large corpus;
        # emptied, not just dropped: the last failed test's traceback may still hold it
        self._ended = True
        for cache in (self.loaded_cache, self._arbiter.cache if self._arbiter else None):
            if cache is not None:
                cache.clear()
        self.loaded_cache = self.as_read = None
        self._arbiter = self.ledger.arbiter = None
        self.ledger.read_entries = {}



def _build_arbiter(settings: ArbiterSettings, cache: MeasureCache | None,
                   histogram: DispatchHistogram) -> Arbiter:
    from pytest_arbiter.core.candidates import REGISTRY
    from pytest_arbiter.decision.arbiter import Arbiter
    from pytest_arbiter.store.cache import MeasureCache

    recheck, budget = None, None
    if settings.recheck != "off":
        from pytest_arbiter.timing.recheck import RecheckPolicy, RunBudget

        recheck = RecheckPolicy(
            key_budget_s=settings.recheck_key_budget or RecheckPolicy.key_budget_s,
            call_timeout_s=settings.call_timeout)
        budget = RunBudget(settings.recheck_budget) if settings.recheck_budget else None
    from pytest_arbiter.timing.measure import ComparePolicy

    policy = ComparePolicy(cap_s=settings.tune_budget or float("inf"),
                           max_rounds=round_limit(settings.tune_budget))
    return Arbiter(registry=REGISTRY, cache=cache if cache is not None else MeasureCache(),
                   mode=settings.mode, histogram=histogram, gate=True, policy=policy,
                   call_timeout_s=settings.call_timeout, recheck=recheck,
                   recheck_budget=budget)


def _say_now(config: pytest.Config) -> Callable[[str], None]:
    """A line on the terminal now, past pytest's output capture (a test is running)."""
    capman = config.pluginmanager.getplugin("capturemanager")

    def say(text: str) -> None:
        suspended = (capman.global_and_fixture_disabled() if capman is not None
                     else contextlib.nullcontext())
        with suspended:
            print(text, file=sys.stderr, flush=True)

    return say


def _xdist_stop(config: pytest.Config) -> Callable[[str], bool] | None:
    """On an xdist controller: a stop that asks the workers to finish (as ``-x`` does),
    so their measured entries come back before the run ends interrupted."""
    dsession = config.pluginmanager.getplugin("dsession")
    if dsession is None:
        return None

    def stop(why: str) -> bool:
        dsession.shouldstop = why
        return True

    return stop


def _write_benchmark_json(path: Path, ledger: RunLedger, root: Path) -> None:
    """``--arbiter-benchmark-json``: the comparisons the run measured and rechecked,
    for pytest-benchmark's tools (:mod:`pytest_arbiter.store.benchmark_json`)."""
    from pytest_arbiter.store import benchmark_json

    try:
        benchmark_json.write(path, ledger.measured_entries(), commit_folder=root,
                             rechecks=ledger.rechecks())
    except ArtifactError as exc:
        ledger.errors.append(f"--arbiter-benchmark-json: {exc}")


def _fail_run(session: pytest.Session) -> None:
    if getattr(session, "exitstatus", None) in (pytest.ExitCode.OK,
                                                pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


class WorkerHooks:
    """A pytest-xdist worker's end of the run: its ledger goes to the controller."""

    def __init__(self, session: ArbiterSession) -> None:
        self.session = session

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        s = self.session
        process.finished(s.factory)
        output = getattr(s.config, "workeroutput", None)
        if output is not None:
            output["arbiter"] = s.ledger.payload()


class ControllerHooks:
    """The controlling process's end of the run (the only process without xdist): the
    workers' ledgers absorbed, the JUnit suite totals, the artifacts, the verdict and the
    summary."""

    def __init__(self, session: ArbiterSession) -> None:
        self.session = session

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        output = getattr(node, "workeroutput", None)
        payload = output.get("arbiter") if isinstance(output, dict) else None
        gateway = getattr(node, "gateway", None)
        name = str(gateway.id if gateway is not None else node)
        s = self.session

        def take_measured(entries: list[CacheEntry]) -> None:
            s.get_arbiter()  # built (the ledger's cache) to take the entries
            s.ledger.take_measured(entries)

        s.ledger.absorb(name, payload, take_measured)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # pytest's junitxml writes a testcase's properties from its teardown report; on
        # the controller this sees every worker's reports too
        if (report.when == "teardown" and report.user_properties
                and _junit_log(self.session.config) is not None):
            from pytest_arbiter.gating.junit import add_recorded

            recorded: dict[HistogramKey, int] = {}
            add_recorded(recorded, report.user_properties)
            self.session.ledger.junit_by_test[report.nodeid] = recorded

    @pytest.hookimpl(tryfirst=True, specname="pytest_sessionfinish")
    def pytest_sessionfinish_junit_totals(self, session: pytest.Session,
                                          exitstatus: int) -> None:
        """Before pytest's junitxml writes the report (its own session-finish hook): the
        run's dispatch totals as suite properties, so that ``pytest-arbiter gate`` can
        tell a complete report from a damaged one (docs/artifacts.md)."""
        s = self.session
        log = _junit_log(s.config)
        if log is None:
            return
        from pytest_arbiter.gating.junit import suite_properties

        ledger = s.ledger
        for name, value in suite_properties(ledger.counts(), ledger.junit_recorded,
                                            s.scope(session, exitstatus).incomplete,
                                            ledger.stale_keys(), ledger.evidence(),
                                            ledger.reasons(), ledger.tests):
            log.add_global_property(name, value)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        s = self.session
        process.finished(s.factory)
        controller = Controller(s.settings, s.ledger, s.baseline, s.as_read)
        s.end = controller.finish(s.scope(session, exitstatus))
        if s.settings.benchmark_json is not None:
            _write_benchmark_json(s.settings.benchmark_json, s.ledger, s.config.rootpath)
        if s._guard is not None and s._guard.why:
            measured = len(s.ledger.measured_entries())
            stopped = ("the run stopped early" if exitstatus == pytest.ExitCode.INTERRUPTED
                       else "after the last test: the run was complete")
            s.ledger.notes.append(
                f"{s._guard.why}: {stopped}; its {measured} measured entries "
                f"were kept ({s.settings.cache or 'no --arbiter-cache: in memory only'})")
        verdict = s.end.verdict
        if verdict is not None:
            hooks.call("pytest_arbiter_verdict", verdict=verdict, counts=s.ledger.counts())
        if s.ledger.errors or s.ledger.crashed:
            _fail_run(session)
        elif verdict is not None and not verdict.passed and s.settings.write_baseline is None:
            _fail_run(session)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        s = self.session
        lines = render(s.ledger, s.settings, cache_note=s.cache_note,
                       baseline_note=s.baseline_note, end=s.end,
                       verbosity=int(s.config.getoption("verbose")))
        if not lines:
            return
        terminalreporter.write_sep("=", "arbiter")
        for line in lines:
            terminalreporter.write_line(line)


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
