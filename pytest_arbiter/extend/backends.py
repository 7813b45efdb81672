"""Backends: one hardware lane each (the CPU, CUDA/ROCm, a vendor's accelerator).

A :class:`Backend` answers four questions for the targets it serves: which device is
here (a :class:`~pytest_arbiter.extend.device.DeviceInfo`, or a string saying why there is
none), how to time a call on it, which arrays live on it, and which candidates it
brings. The bundled CPU and CUDA/ROCm lanes are backends; an installed package adds its
own through the ``pytest_arbiter_add_backends`` hook (:mod:`pytest_arbiter.extend.hookspecs`).

:data:`BACKENDS` is the table the device probe, the array lookup and the timer lookup
read. It is filled by :func:`pytest_arbiter.extend.hooks.load_backends` on first need, never
by importing a module.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_arbiter.core.candidates import register_target

if TYPE_CHECKING:
    from pytest_arbiter.core.candidates import Candidate
    from pytest_arbiter.timing.measure import Timer


@dataclass(frozen=True)
class DeviceInfo:
    """A device tag plus the human-readable name kept in cache provenance.

    ``uuid``: the physical device (a GPU's UUID), where the backend knows it; several
    devices share a tag (eight H100s are all ``sm_90``), and a measurement lock is
    per physical device (``extend.device.lock_identity``).
    """

    tag: str
    name: str
    uuid: str = ""


class Backend:
    """One hardware lane. Subclass it and return an instance from the
    ``pytest_arbiter_add_backends`` hook.

    ``targets``: the targets it serves (new ones become known targets when it is added);
    ``array_modules``: the top-level packages whose arrays live on its targets (``cupy``);
    ``fallback``: a bundled lane, which an installed backend for the same target replaces.
    """

    name: str = ""
    targets: tuple[str, ...] = ()
    array_modules: tuple[str, ...] = ()
    fallback: bool = False

    def probe(self, target: str) -> DeviceInfo | str:
        """The device ``target`` runs on here, or a string saying why there is none.

        Called once per target and process (:func:`pytest_arbiter.extend.device.forget` asks
        again); an exception is turned into the reason."""
        raise NotImplementedError

    def timer(self, target: str) -> Timer | None:
        """The timer measured arbitration uses on ``target``; ``None``: the CPU clock."""
        return None

    def array_target(self, array: object) -> str:
        """The target an array of one of :attr:`array_modules` lives on."""
        return self.targets[0]

    def candidates(self) -> Iterable[Candidate]:
        """Fresh instances of the candidates this backend brings."""
        return ()

    def environment(self, target: str) -> Iterable[tuple[str, str]]:
        """What else timings on ``target`` are valid under, as ``(name, version)`` pairs
        (a GPU lane's runtime, driver and compiler versions); recorded in each entry's
        environment. Only called once the target's device was found."""
        return ()

    def __repr__(self) -> str:
        return f"<Backend {self.name or type(self).__qualname__} targets={self.targets}>"


class BackendTable:
    """Backends by target and by array package."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_target: dict[str, Backend] = {}
        self._by_module: dict[str, Backend] = {}

    def add(self, backend: Backend) -> bool:
        """Add ``backend``; whether it was added. A fallback (a bundled lane) serves only
        the targets no installed backend serves, and is not added when none is left.

        Two non-fallback backends for one target are a ``ValueError`` naming both; the
        same class added again (a re-imported plugin) replaces the first silently.
        """
        if not isinstance(backend, Backend):
            raise TypeError(f"a backend must be a pytest_arbiter.Backend, got {backend!r}")
        if not backend.targets or not all(isinstance(t, str) and t for t in backend.targets):
            raise ValueError(f"backend {backend!r}: targets must be non-empty strings")
        with self._lock:
            free = []
            for target in backend.targets:
                held = self._by_target.get(target)
                if held is None or held.fallback or _same_code(held, backend):
                    free.append(target)
                elif not backend.fallback:
                    raise ValueError(f"target {target!r} is served by two backends: "
                                     f"{held!r} ({type(held).__module__}) and {backend!r} "
                                     f"({type(backend).__module__})")
            if not free:
                return False
            for target in free:
                register_target(target)
                self._by_target[target] = backend
            for module in backend.array_modules:
                held = self._by_module.get(module)
                if held is None or held.fallback or not backend.fallback:
                    self._by_module[module] = backend
        return True

    def for_target(self, target: str) -> Backend | None:
        return self._by_target.get(target)

    def for_array_module(self, module: str) -> Backend | None:
        return self._by_module.get(module)

    def targets(self) -> tuple[str, ...]:
        """Every target a backend serves, sorted."""
        return tuple(sorted(self._by_target))

    def array_modules(self) -> tuple[str, ...]:
        return tuple(sorted(self._by_module))

    def remove(self, backend: Backend) -> None:
        """Take ``backend`` out (tests; a plugin being unregistered)."""
        with self._lock:
            for table in (self._by_target, self._by_module):
                for key in [k for k, b in table.items() if b is backend]:
                    del table[key]


def _same_code(a: Backend, b: Backend) -> bool:
    return (type(a).__module__, type(a).__qualname__) == (type(b).__module__,
                                                           type(b).__qualname__)


BACKENDS = BackendTable()
"""The process's backends (filled by :func:`pytest_arbiter.extend.hooks.load_backends`)."""
