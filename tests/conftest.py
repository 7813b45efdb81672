"""Shared fixtures for the project's own tests."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from pytest_arbiter.candidates import CandidateRegistry
from pytest_arbiter.runtime import register_bundled


@pytest.fixture
def registry() -> CandidateRegistry:
    """A fresh registry holding only the bundled candidates."""
    reg = CandidateRegistry()
    register_bundled(reg)
    return reg


@pytest.fixture
def rng() -> Iterator[np.random.Generator]:
    yield np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _inner_runs_are_not_xdist_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``pytest -n N`` on this suite, the pytester runs a test starts must not
    inherit the xdist worker's identity from the environment."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
