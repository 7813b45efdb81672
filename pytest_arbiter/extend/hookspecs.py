"""The hooks pytest-arbiter calls: how a package extends it, and what it reports.

Implement them in a module (or object) and either

* list it in the ``pytest_arbiter`` entry-point group of your package, so installing the
  package is enough, with or without pytest::

      [project.entry-points.pytest_arbiter]
      my_kernels = "my_kernels.arbiter_plugin"

* or, in a pytest run, define them in a ``conftest.py`` or a pytest plugin.

Mark implementations with :data:`hookimpl` (``from pytest_arbiter import hookimpl``) to
pass pluggy options such as ``tryfirst``; unmarked functions named ``pytest_arbiter_*``
are found too, as pytest finds unmarked ``pytest_*`` hooks. docs/hooks.md has an example
for each hook.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from pytest_arbiter.core.candidates import Candidate
    from pytest_arbiter.core.gate import GateReport
    from pytest_arbiter.extend.backends import Backend
    from pytest_arbiter.gating.baseline import BaselineVerdict
    from pytest_arbiter.gating.histogram import HistogramKey
    from pytest_arbiter.store.cache import CacheEntry

PROJECT = "pytest_arbiter"
"""The pluggy project name, and the entry-point group installed packages use."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(historic=True)
def pytest_arbiter_add_backends() -> Iterable[Backend]:
    """Return the backends (hardware lanes) this plugin brings.

    Called once, the first time a device, an array's target, a timer or the candidate
    registry is needed, and again for a plugin registered later. A backend's targets
    become known targets and its :meth:`~pytest_arbiter.Backend.candidates` are
    registered. A backend for a target the bundled lanes serve replaces the bundled one.

    Example::

        class NpuBackend(pytest_arbiter.Backend):
            name, targets = "npu", ("npu",)
            def probe(self, target):
                return DeviceInfo("npu-v2", "Acme NPU v2") if acme.found() else "no NPU"

        @pytest_arbiter.hookimpl
        def pytest_arbiter_add_backends():
            return [NpuBackend()]
    """
    raise NotImplementedError  # pragma: no cover - a specification


@hookspec(historic=True)
def pytest_arbiter_add_candidates() -> Iterable[Candidate]:
    """Return candidates to register for targets that already exist (``cpu``, a
    backend's), when the registry is first read.

    Example::

        @pytest_arbiter.hookimpl
        def pytest_arbiter_add_candidates():
            return [FunctionCandidate(my_matmul, "my_matmul", "matmul", "cpu", 3,
                                      None, None)]
    """
    raise NotImplementedError  # pragma: no cover - a specification


@hookspec
def pytest_arbiter_candidate_measured(entry: CacheEntry) -> None:
    """Measured arbitration made a new cache entry: ``entry.winner`` on ``entry.device``
    for ``entry.key``, with the timings behind it in ``entry.ranking``.

    Runs in the process that measured (an xdist worker, under ``-n``).

    Example::

        def pytest_arbiter_candidate_measured(entry):
            log.info("%s wins %s on %s", entry.winner, entry.bucket, entry.device)
    """


@hookspec
def pytest_arbiter_gate_failed(report: GateReport) -> None:
    """A candidate failed the F4 accuracy gate (its output left the op's per-dtype error
    budget, or it raised): ``report.summary()`` is the readable report.

    Example::

        def pytest_arbiter_gate_failed(report):
            tracker.file(f"{report.candidate} is wrong", report.summary())
    """


@hookspec
def pytest_arbiter_verdict(verdict: BaselineVerdict,
                           counts: Mapping[HistogramKey, int]) -> None:
    """The run's degrade-gate verdict, at the end of a pytest run (on the xdist
    controller): ``verdict.passed``, ``verdict.new`` (the failing entries the baseline
    does not list), ``verdict.fixed``; ``counts``: the whole dispatch histogram,
    ``(target, op, selected, outcome) -> count``.

    Example::

        def pytest_arbiter_verdict(verdict, counts):
            requests.post(DASHBOARD, json={"passed": verdict.passed,
                                           "new": ["/".join(k) for k in verdict.new]})
    """
