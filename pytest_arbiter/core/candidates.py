"""Candidates: implementations of an op for one target, and the registry that holds them."""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable, Iterable
from typing import Any

from pytest_arbiter.core.changes import Listeners
from pytest_arbiter.core.names import check_name
from pytest_arbiter.core.regions import Region

TARGETS = ("cpu", "nvidia", "amd")
_BUNDLED_LOCK = threading.RLock()
_TARGETS_LOCK = threading.Lock()
_KNOWN_TARGETS: set[str] = set(TARGETS)


def register_target(name: str) -> None:
    """Make ``name`` a known target, so candidates for it can be registered (for backends)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a target must be a non-empty string, got {name!r}")
    with _TARGETS_LOCK:
        _KNOWN_TARGETS.add(name)


def known_targets() -> tuple[str, ...]:
    """The targets candidates may be registered for, sorted."""
    with _TARGETS_LOCK:
        return tuple(sorted(_KNOWN_TARGETS))


def _check_target(who: str, target: object) -> None:
    if not isinstance(target, str) or target not in _KNOWN_TARGETS:
        raise ValueError(
            f"{who}: unknown target {target!r}; known targets: "
            f"{', '.join(known_targets())} (a backend adds its own with register_target())")


def _check_align(name: str, align: object) -> tuple[int, ...]:
    if not isinstance(align, (tuple, list)):
        raise ValueError(f"candidate {name!r}: align must be a tuple of powers of two, "
                         f"got {align!r}")
    for value in align:
        if (not isinstance(value, int) or isinstance(value, bool) or value < 1
                or value & (value - 1)):
            raise ValueError(f"candidate {name!r}: every align value must be a positive "
                             f"power of two, got {value!r} in {tuple(align)!r}")
    return tuple(align)


def _origin(cand: Candidate) -> tuple[str, str]:
    """``(module, qualname)`` of the code that defines ``cand``: its function or its class."""
    code: Any = cand.fn if isinstance(cand, FunctionCandidate) else type(cand)
    module = getattr(code, "__module__", None) or "?"
    qualname = getattr(code, "__qualname__", None) or getattr(code, "__name__", None) or repr(code)
    return str(module), str(qualname)


def _reimported(old: Candidate, new: Candidate) -> bool:
    """Whether ``new`` is ``old`` again: the same function or class, or the same code
    from a fresh import of its module (pytester's in-process runs re-import a test
    module). Two function objects of one module with one qualname (lambdas, closures
    of one factory) are two candidates."""
    if _origin(old) != _origin(new):
        return False
    if isinstance(old, FunctionCandidate) and isinstance(new, FunctionCandidate):
        return old.fn is new.fn or old.fn.__globals__ is not new.fn.__globals__
    return True  # one class's instances: the same kernel registered again


def definition_site(cand: Candidate) -> str:
    """``path:line`` of the code that defines ``cand`` (its function, else its class);
    ``"?"`` when Python cannot tell."""
    code: Any = cand.fn if isinstance(cand, FunctionCandidate) else type(cand)
    try:
        code = inspect.unwrap(code)
        found = getattr(code, "__code__", None)
        if found is not None:
            return f"{found.co_filename}:{found.co_firstlineno}"
        return f"{inspect.getsourcefile(code)}:{inspect.getsourcelines(code)[1]}"
    except (OSError, TypeError, ValueError):
        return "?"


class Candidate:
    """One implementation of an op for one target.

    Subclass it for kernels that need state (compiled modules, device handles), or use
    the :func:`candidate` decorator for a plain function.

    ``align``: the alignment each bucket dimension must have for the kernel to run
    (matmul: ``(m, n, k)``; softmax: ``(rows, last axis)``; a user op: its inputs'
    dimensions flattened in order), powers of two; ``()`` when any shape runs. A subclass
    may declare it as a class attribute. ``version`` is stored for the artifacts.
    """

    name: str
    op: str
    target: str
    tier: int
    align: tuple[int, ...] = ()
    version: str | None = None

    def __init__(self, name: str, op: str, target: str, tier: int = 0, *,
                 align: tuple[int, ...] | None = None, version: str | None = None) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"candidate name must be a non-empty string, got {name!r}")
        if not isinstance(tier, int) or isinstance(tier, bool):
            raise ValueError(f"candidate {name!r}: tier must be an integer, got {tier!r}")
        if not target or not isinstance(target, str):
            raise ValueError(f"candidate {name!r}: target must be a non-empty string")
        if version is not None and not isinstance(version, str):
            raise TypeError(f"candidate {name!r}: version must be a string or None, "
                            f"got {type(version).__name__}")
        self.name, self.op, self.target, self.tier = name, op, target, tier
        self.align = _check_align(name, self.align if align is None else align)
        if version is not None:
            self.version = version

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
                 available: Callable[[], bool | str | None] | None, *,
                 align: tuple[int, ...] | None = None, version: str | None = None) -> None:
        super().__init__(name, op, target, tier, align=align, version=version)
        for what, value in (("accepts", accepts), ("available", available)):
            if value is not None and not callable(value):
                raise TypeError(f"candidate {name!r}: {what} must be callable or None, "
                                f"got {type(value).__name__} {value!r}")
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
        verdict = probe()
        if verdict is True or verdict is None:
            return None
        if isinstance(verdict, str):
            return verdict or "unavailable"
        return "its available() check returned False"

    def run(self, *inputs: Any) -> Any:
        return self.fn(*inputs)


class CandidateRegistry:
    """Candidates by unique name, thread-safe to register into.

    ``bundled``: the first time it is read, the registry has the backends loaded
    (:func:`pytest_arbiter.extend.hooks.load_candidates`), which register the bundled kernels and
    every plugin's into :data:`REGISTRY`; importing a module registers nothing.
    """

    def __init__(self, *, bundled: bool = False) -> None:
        self._by_name: dict[str, Candidate] = {}
        self._lock = threading.Lock()
        self._bundled_pending = bundled
        self._bundled_loading = False
        self.generation = 0
        self.changed = Listeners()
        """Told whenever a candidate is added or removed (the arbiters' plan tables)."""
        self._align_memo: tuple[int, dict[tuple[str, str], tuple[int, ...]]] = (-1, {})

    def _load_bundled(self) -> None:
        if self._bundled_pending:
            with _BUNDLED_LOCK:  # reentrant: the runtime registers into this registry
                if self._bundled_pending and not self._bundled_loading:
                    self._bundled_loading = True
                    try:
                        importlib.import_module("pytest_arbiter.extend.hooks").load_candidates()
                    finally:
                        self._bundled_loading = False
                    self._bundled_pending = False

    def add(self, cand: Candidate, *, replace: bool = False) -> Candidate:
        """Register ``cand``; its target must be known and its name unique.

        A second candidate with a taken name is ``ValueError`` unless ``replace`` is
        true, or it comes from the same defining code (a re-import of its module, as
        pytest's in-process runs do), which replaces the first silently.
        """
        check_name("candidate", cand.name)
        _check_target(f"candidate {cand.name!r}", cand.target)
        self._load_bundled()  # a user's candidate must not shadow a bundled name unseen
        with self._lock:
            existing = self._by_name.get(cand.name)
            if existing is not None and not replace and not _reimported(existing, cand):
                module, qualname = _origin(existing)
                raise ValueError(
                    f"candidate name {cand.name!r} is already registered (op "
                    f"{existing.op!r}, target {existing.target!r}, defined by "
                    f"{module}.{qualname}); names must be unique: rename the new one "
                    f"(defined by {'.'.join(_origin(cand))}) or pass replace=True")
            self._by_name[cand.name] = cand
            self.generation += 1
        self.changed.fire()
        return cand

    def registered(self) -> list[Candidate]:
        """The candidates registered so far, without loading the bundled ones."""
        with self._lock:
            return list(self._by_name.values())

    def remove(self, name: str) -> None:
        with self._lock:
            self._by_name.pop(name, None)
            self.generation += 1
        self.changed.fire()

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

    def alignment_needs(self, op: str, target: str) -> tuple[int, ...]:
        """Per bucket dimension, the largest alignment any candidate of ``op`` on ``target``
        declares (shorter declarations count as 1 beyond their end); ``()`` when none does.

        Memoised until the registry changes (``generation``), so it is cheap to ask often.
        """
        self._load_bundled()
        generation, memo = self._align_memo
        if generation == self.generation:
            found = memo.get((op, target))
            if found is not None:
                return found
        with self._lock:
            generation = self.generation
            aligns = [c.align for c in self._by_name.values()
                      if c.op == op and c.target == target and c.align]
        width = max((len(a) for a in aligns), default=0)
        needs = tuple(max((a[i] if i < len(a) else 1) for a in aligns) for i in range(width))
        if self._align_memo[0] != generation:
            self._align_memo = (generation, {})
        self._align_memo[1][(op, target)] = needs
        return needs

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
              available: Callable[[], bool | str | None] | None = None,
              registry: CandidateRegistry | None = None, replace: bool = False,
              align: tuple[int, ...] | None = None,
              version: str | None = None) -> Callable[[Callable[..., Any]], Any]:
    """Register a function kernel as a candidate of ``op`` for ``target``.

    ``accepts(*inputs)`` says whether the kernel can run these inputs; ``available()``
    returns True, False, or a string saying why the kernel cannot run here; both must be
    callables. ``align`` declares the power-of-two alignment each bucket dimension needs
    (see :class:`Candidate`). A name already taken by other code is refused unless
    ``replace`` is true. The decorated function is returned unchanged; the candidate is
    its ``arbiter_candidate``.
    """
    if not isinstance(op, str) or not op:
        raise ValueError(f"candidate op must be a non-empty string, got {op!r}")
    _check_target(f"candidate {name!r}" if name else f"a candidate of op {op!r}", target)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        cand = FunctionCandidate(fn, name or fn.__name__, op, target, tier, accepts, available,
                                 align=align, version=version)
        (registry or REGISTRY).add(cand, replace=replace)
        try:
            fn.arbiter_candidate = cand  # type: ignore[attr-defined]
        except AttributeError:
            pass
        return fn

    return decorate
