"""The arbiter's plugin manager: backends, candidates and reports through pluggy.

:func:`manager` is a ``pluggy.PluginManager("pytest_arbiter")`` with the specifications
of :mod:`pytest_arbiter.extend.hookspecs`, made on first use; it loads the setuptools
entry-point group ``pytest_arbiter``, so an installed package's backends, candidates
and report hooks take part without being imported by hand, in a pytest run or not.
:func:`load_backends` registers the bundled lanes (:mod:`pytest_arbiter.runtime`) the
first time a device, a timer or an array's target is needed, and fills
:data:`~pytest_arbiter.extend.backends.BACKENDS` from ``pytest_arbiter_add_backends``;
:func:`load_candidates`, the first time the registry is read, registers the backends'
candidates and those of ``pytest_arbiter_add_candidates``. Importing a module registers
nothing.

Why one manager of our own and a relay, not pytest's: the runtime calls these hooks in
a library's process too, where there is no pytest (and must not be: the runtime never
imports it). In a pytest run the plugin adds the same specifications to pytest's
manager (``pytest_addhooks``, so conftest implementations are validated) and hands
:func:`relay_to` the run's ``config.hook``; a :class:`_PytestRelay` registered here
forwards every hook to it. That keeps one call path (runtime -> this manager), reaches
conftest files and pytest plugins, and lets pluggy's historic calls do the late
joining: the relay registered after the backends were loaded still has its
``add_backends``/``add_candidates`` results installed, because pluggy replays a
historic call to every plugin registered later. pluggy has no manager-to-manager
forwarding of its own; a plugin that is both a pytest plugin and in the
``pytest_arbiter`` group is called twice, so list it in one group only.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pluggy

from pytest_arbiter.extend import hookspecs
from pytest_arbiter.extend.backends import BACKENDS, Backend

if TYPE_CHECKING:
    from pytest_arbiter.core.candidates import Candidate

_LOCK = threading.RLock()
_MANAGER: list[pluggy.PluginManager] = []
_RELAY: list[_PytestRelay] = []
_STATE = dict.fromkeys(("backends", "backends_done", "candidates", "candidates_done"), False)
_PENDING: list[Backend] = []  # backends whose candidates wait for load_candidates()


class _ArbiterPluginManager(pluggy.PluginManager):
    """Also takes unmarked ``pytest_arbiter_*`` functions, as pytest takes ``pytest_*``."""

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("pytest_arbiter_"):
            method = getattr(plugin, name, None)
            if inspect.isroutine(method):
                return {}
        return opts


BUNDLED = "pytest_arbiter.runtime"
"""The bundled lanes' plugin, registered by name on first need as an installed plugin's
entry point is: the lanes import this layer, never the other way round."""


def plugin_manager() -> pluggy.PluginManager:
    """The process's arbiter plugin manager, made (and the entry points loaded) once."""
    if _MANAGER:
        return _MANAGER[0]
    with _LOCK:
        if not _MANAGER:
            pm = _ArbiterPluginManager(hookspecs.PROJECT)
            pm.add_hookspecs(hookspecs)
            pm.load_setuptools_entrypoints(hookspecs.PROJECT)
            if _RELAY:
                pm.register(_RELAY[-1], _RELAY_NAME)
            _MANAGER.append(pm)
    return _MANAGER[0]


def load_backends() -> None:
    """Register the bundled lanes and install every plugin's backends (once). Their
    candidates wait for :func:`load_candidates`: a device probe imports no kernel."""
    if _STATE["backends_done"]:
        return
    with _LOCK:  # reentrant: a backend's own lookups may come back here meanwhile
        if _STATE["backends"]:
            return
        pm = plugin_manager()
        bundled = importlib.import_module(BUNDLED)
        if not pm.is_registered(bundled):
            pm.register(bundled, BUNDLED)
        _STATE["backends"] = True
        pm.hook.pytest_arbiter_add_backends.call_historic(result_callback=_install_backends)
        _STATE["backends_done"] = True


def load_candidates() -> None:
    """Register the loaded backends' candidates and every plugin's
    ``pytest_arbiter_add_candidates`` into :data:`~pytest_arbiter.core.candidates.REGISTRY`
    (once; the reentrant call of a candidate being registered meanwhile returns)."""
    if _STATE["candidates_done"]:
        return
    with _LOCK:
        if _STATE["candidates"]:
            return
        _STATE["candidates"] = True  # from here on, a backend added brings its candidates
        load_backends()
        from pytest_arbiter.core.candidates import REGISTRY

        pending, _PENDING[:] = list(_PENDING), []
        for backend in pending:
            REGISTRY.extend(backend.candidates())
        plugin_manager().hook.pytest_arbiter_add_candidates.call_historic(
            result_callback=_install_candidates)
        _STATE["candidates_done"] = True


def _install_backends(found: Iterable[Backend] | None) -> None:
    for backend in found or ():
        if not BACKENDS.add(backend):
            continue
        if _STATE["candidates"]:
            from pytest_arbiter.core.candidates import REGISTRY

            REGISTRY.extend(backend.candidates())
        else:
            _PENDING.append(backend)


def _install_candidates(found: Iterable[Candidate] | None) -> None:
    from pytest_arbiter.core.candidates import REGISTRY

    REGISTRY.extend(found or ())


def call(name: str, **kwargs: Any) -> None:
    """Call the notification hook ``name`` (``pytest_arbiter_gate_failed``, ...).

    A plugin that raises is the plugin's bug, not the run's: it propagates."""
    getattr(plugin_manager().hook, name)(**kwargs)


_RELAY_NAME = "pytest-arbiter-pytest-relay"


class _PytestRelay:
    """Forwards this manager's hooks to a pytest run's ``config.hook`` (conftest files,
    pytest plugins)."""

    def __init__(self, relay: Any) -> None:
        self.relay = relay

    def pytest_arbiter_add_backends(self) -> list[Backend]:
        return [b for found in self.relay.pytest_arbiter_add_backends() for b in found or ()]

    def pytest_arbiter_add_candidates(self) -> list[Candidate]:
        return [c for found in self.relay.pytest_arbiter_add_candidates()
                for c in found or ()]

    def pytest_arbiter_candidate_measured(self, entry: Any) -> None:
        self.relay.pytest_arbiter_candidate_measured(entry=entry)

    def pytest_arbiter_gate_failed(self, report: Any) -> None:
        self.relay.pytest_arbiter_gate_failed(report=report)

    def pytest_arbiter_verdict(self, verdict: Any, counts: Any) -> None:
        self.relay.pytest_arbiter_verdict(verdict=verdict, counts=counts)


def relay_to(hook_relay: Any) -> None:
    """Forward this manager's hooks to ``hook_relay`` (a pytest run's ``config.hook``)
    until :func:`stop_relay`; a nested run (pytester) relays to its own until it ends.
    The manager is not made for this: a run that never needs it loads no entry point."""
    with _LOCK:
        _RELAY.append(_PytestRelay(hook_relay))
        _register_active_relay()


def stop_relay(hook_relay: Any) -> None:
    """Stop forwarding to ``hook_relay``; the enclosing run's relay, if any, is active
    again."""
    with _LOCK:
        _RELAY[:] = [r for r in _RELAY if r.relay is not hook_relay]
        _register_active_relay()


def _register_active_relay() -> None:
    pm = _MANAGER[0] if _MANAGER else None
    if pm is None:
        return
    held = pm.get_plugin(_RELAY_NAME)
    active = _RELAY[-1] if _RELAY else None
    if held is active:
        return
    if held is not None:
        pm.unregister(held)
    if active is not None:
        pm.register(active, _RELAY_NAME)
