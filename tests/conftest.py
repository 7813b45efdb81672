"""Shared fixtures for the project's own tests."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

# imported before any pytester in-process run: such a run drops the modules first
# imported during it, and a later run would register its ops into a second copy of the
# op registry that the already-imported dispatch code never reads
import pytest_arbiter.core.ops  # noqa: F401
from pytest_arbiter.core.candidates import CandidateRegistry
from pytest_arbiter.extend import device as core_device
from pytest_arbiter.runtime import register_bundled
from pytest_arbiter.runtime.cuda import device as cuda_device, lane
from pytest_arbiter.timing.watchdog import watchdog_available


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts xdist workers, runs the CUDA emulator or asserts what a timed
    comparison picked (``timing``) is slow too, so the quick tier is ``-m "not slow"``
    (or, saying it all, ``-m "not slow and not emulated"``)."""
    for item in items:
        if any(item.get_closest_marker(name) is not None
               for name in ("xdist", "emulated", "timing")):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def registry() -> CandidateRegistry:
    """A fresh registry holding only the bundled candidates."""
    reg = CandidateRegistry()
    register_bundled(reg)
    return reg


@pytest.fixture
def clean_registry() -> Iterator[None]:
    """Remove the candidates an inner (in-process) pytester run registered into the
    global registry, so the next inner run may register the same names."""
    from pytest_arbiter import REGISTRY

    before = {c.name for c in REGISTRY}
    yield
    for cand in list(REGISTRY):
        if cand.name not in before:
            REGISTRY.remove(cand.name)


@pytest.fixture
def rng() -> Iterator[np.random.Generator]:
    yield np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _inner_runs_leave_out_hypothesis(request: pytest.FixtureRequest,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The pytest runs a test starts with ``pytester`` load no hypothesis plugin: no inner
    project uses it, and importing it is two thirds of a subprocess run's CPU (0.9 s to
    0.3 s a run, the quick tier's largest cost)."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # it clears PYTEST_ADDOPTS: set it after
        monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:hypothesispytest")


@pytest.fixture(autouse=True)
def _inner_runs_are_not_xdist_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``pytest -n N`` on this suite, the pytester runs a test starts must not
    inherit the xdist worker's identity from the environment."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


def _forget_all() -> None:
    cuda_device.reset()
    lane.reset_bfloat16_probe()
    core_device.forget("nvidia")
    core_device.forget("amd")


@pytest.fixture
def cupy_as(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Any], None]]:
    """Make the lazy CuPy import return a given module, or raise a given exception."""

    def install(found: Any) -> None:
        def fake_import() -> Any:
            if isinstance(found, BaseException):
                raise found
            return found

        monkeypatch.setattr(cuda_device, "_import_cupy", fake_import)
        _forget_all()

    yield install
    monkeypatch.undo()
    _forget_all()


@pytest.fixture
def sigalrm_restored() -> Iterator[None]:
    """SIGALRM's handler and real-time timer put back as they were, whatever the test did;
    skipped where the watchdog cannot be used (no setitimer, not the main thread, or
    another handler such as pytest-timeout's already installed)."""
    if not watchdog_available():
        pytest.skip("the SIGALRM watchdog cannot be used here (no setitimer, not the main "
                    "thread, or another SIGALRM handler such as pytest-timeout's)")
    handler = signal.getsignal(signal.SIGALRM)
    left, interval = signal.getitimer(signal.ITIMER_REAL)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if handler is None else handler)
        if left > 0:
            signal.setitimer(signal.ITIMER_REAL, left, interval)
