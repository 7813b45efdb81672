"""Candidates: implementations of an op for one target, and the registry that holds them."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable
from typing import Any

from pytest_arbiter.regions import Region

TARGETS = ("cpu", "nvidia", "amd")
_BUNDLED_LOCK = threading.RLock()


class Decline(Exception):
    """Raised by a kernel to hand the work back to the reference (recorded as ``degraded``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Candidate:
    """One implementation of an op for one target.

    Subclass it for kernels that need state (compiled modules, device handles), or use
    the :func:`candidate` decorator for a plain function.
    """

    name: str
    op: str
    target: str
    tier: int

    def __init__(self, name: str, op: str, target: str, tier: int = 0) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"candidate name must be a non-empty string, got {name!r}")
        if not isinstance(tier, int) or isinstance(tier, bool):
            raise ValueError(f"candidate {name!r}: tier must be an integer, got {tier!r}")
        if not target or not isinstance(target, str):
            raise ValueError(f"candidate {name!r}: target must be a non-empty string")
        self.name, self.op, self.target, self.tier = name, op, target, tier

    def applies_to(self, region: Region) -> bool:
        """Whether this candidate implements ``region``'s op (dtype limits go in ``accepts``)."""
        return region.op == self.op

    def available(self) -> bool:
        """Whether this candidate can run on this machine at all."""
        return self.unavailable_reason() is None

    def unavailable_reason(self) -> str | None:
        """Why the candidate cannot run here, or ``None`` when it can."""
        return None

    def accepts(self, *inputs: Any) -> bool:
        """Whether the candidate can run these inputs (alignment, contiguity, size, dtype)."""
        return True

    def prepare_inputs(self, *inputs: Any) -> tuple[Any, ...]:
        """Move host inputs to where the kernel runs (the GPU lanes copy them to the device)."""
        return inputs

    def run(self, *inputs: Any) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Candidate {self.name} op={self.op} target={self.target} tier={self.tier}>"


class FunctionCandidate(Candidate):
    """A candidate made from a plain kernel function by :func:`candidate`."""

    def __init__(self, fn: Callable[..., Any], name: str, op: str, target: str, tier: int,
                 accepts: Callable[..., bool] | None,
                 available: Callable[[], bool | str | None] | bool | None) -> None:
        super().__init__(name, op, target, tier)
        self.fn = fn
        self._accepts = accepts
        self._available = available
        self.run = fn  # type: ignore[method-assign]  # one call less on the hot path
        if accepts is not None:
            self.accepts = accepts  # type: ignore[method-assign]

    def unavailable_reason(self) -> str | None:
        probe = self._available
        if probe is None:
            return None
        verdict = probe() if callable(probe) else probe
        if verdict is True or verdict is None:
            return None
        if isinstance(verdict, str):
            return verdict or "unavailable"
        return "its available() check returned False"

    def run(self, *inputs: Any) -> Any:
        return self.fn(*inputs)


class CandidateRegistry:
    """Candidates by unique name, thread-safe to register into.

    ``bundled``: the registry imports the bundled runtime (which registers its kernels
    into :data:`REGISTRY`) the first time it is read, not when the package is imported.
    """

    def __init__(self, *, bundled: bool = False) -> None:
        self._by_name: dict[str, Candidate] = {}
        self._lock = threading.Lock()
        self._bundled_pending = bundled
        self.generation = 0

    def _load_bundled(self) -> None:
        if self._bundled_pending:
            with _BUNDLED_LOCK:  # reentrant: the runtime registers into this registry
                if self._bundled_pending:
                    importlib.import_module("pytest_arbiter.runtime")
                    self._bundled_pending = False

    def add(self, cand: Candidate) -> Candidate:
        with self._lock:
            existing = self._by_name.get(cand.name)
            if existing is not None and (existing.op, existing.target) != (cand.op, cand.target):
                raise ValueError(
                    f"candidate name {cand.name!r} is already registered for op "
                    f"{existing.op!r} on target {existing.target!r}; names must be unique")
            # same name, op and target: a re-import of the defining module replaces it
            self._by_name[cand.name] = cand
            self.generation += 1
        return cand

    def remove(self, name: str) -> None:
        with self._lock:
            self._by_name.pop(name, None)
            self.generation += 1

    def get(self, name: str) -> Candidate:
        self._load_bundled()
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name)) or "none"
            raise KeyError(f"no candidate named {name!r}; registered: {known}") from None

    def __contains__(self, name: object) -> bool:
        self._load_bundled()
        return name in self._by_name

    def for_op(self, op: str, target: str | None = None) -> list[Candidate]:
        """Candidates of ``op`` (optionally one target), highest tier first, then by name."""
        self._load_bundled()
        found = [c for c in self._by_name.values()
                 if c.op == op and (target is None or c.target == target)]
        return sorted(found, key=lambda c: (-c.tier, c.name))

    def targets_for(self, op: str) -> list[str]:
        self._load_bundled()
        return sorted({c.target for c in self._by_name.values() if c.op == op})

    def __iter__(self) -> Any:
        self._load_bundled()
        return iter(list(self._by_name.values()))

    def extend(self, cands: Iterable[Candidate]) -> None:
        for c in cands:
            self.add(c)


REGISTRY = CandidateRegistry(bundled=True)


def candidate(op: str, *, target: str, name: str | None = None, tier: int = 0,
              accepts: Callable[..., bool] | None = None,
              available: Callable[[], bool | str | None] | bool | None = None,
              registry: CandidateRegistry | None = None) -> Callable[[Callable[..., Any]], Any]:
    """Register a function kernel as a candidate of ``op`` for ``target``.

    ``accepts(*inputs)`` says whether the kernel can run these inputs; ``available()``
    returns True, False, or a string saying why the kernel cannot run here. The
    decorated function is returned unchanged; the candidate is its ``arbiter_candidate``.
    """
    if not isinstance(op, str) or not op:
        raise ValueError(f"candidate op must be a non-empty string, got {op!r}")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        cand = FunctionCandidate(fn, name or fn.__name__, op, target, tier, accepts, available)
        (registry or REGISTRY).add(cand)
        try:
            fn.arbiter_candidate = cand  # type: ignore[attr-defined]
        except AttributeError:
            pass
        return fn

    return decorate
