"""What a measurement was taken against: the candidates' code and the environment.

A cache entry records, for every candidate considered for its key, the fingerprint of
the candidate's code (:func:`fingerprint_of`), and the environment its timings are
valid under (:func:`current_environment`). A candidate whose code changed, one added
or removed, or a new driver, CuPy, NumPy or BLAS makes the entry's measurement stale:
the next tune measures the key again, and the new entry supersedes the old one in a
merge (docs/artifacts.md).

The fingerprint of Python code is a hash of its bytecode, constants and names, which
differ between Python minor versions: the environment records the Python version too.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import types
import weakref
from collections.abc import Callable
from typing import Any

from pytest_arbiter.core.candidates import Candidate, FunctionCandidate
from pytest_arbiter.core.ops import Op
from pytest_arbiter.extend.libraries import library_versions
from pytest_arbiter.extend.literals import knob

FINGERPRINT_HEX = 16
"""Hex digits of a fingerprint (64 bits)."""


def fingerprint_of(candidate: Candidate) -> str:
    """A short, stable hex hash of what ``candidate`` runs (worked out once per
    candidate object).

    A function candidate: its function's code (bytecode, constants including nested
    functions' code, global and attribute names; docstrings and line numbers left out).
    A :class:`~pytest_arbiter.core.candidates.Candidate` subclass: the code of every method
    its class and its bases define below ``Candidate`` (``run`` and what it calls on
    ``self``: ``launch``, ``problem``, ...), plus what its ``fingerprint_parts()`` or
    ``source()`` returns (a ``.cu`` kernel's source text and compile options). Either
    way, plus ``candidate.version`` when one is declared.
    """
    if not isinstance(candidate, Candidate):
        raise TypeError(f"fingerprint_of takes a candidate (pytest_arbiter.REGISTRY.get("
                        f"name)), not {type(candidate).__name__} {candidate!r}")
    found = _MEMO.get(candidate)
    if found is None:
        found = _MEMO[candidate] = _fingerprint(candidate)
    return found


_MEMO: weakref.WeakKeyDictionary[Candidate, str] = weakref.WeakKeyDictionary()


def op_fingerprint(op: Op) -> str | None:
    """A short hex hash of a user op's definition: the code of its reference,
    ``validate``, ``budget`` and ``gate_inputs`` (as :func:`fingerprint_of` hashes a
    kernel's) and its ``out_dtype``; ``None`` for a built-in op, whose definition is
    the package's. What a gate verdict is made against besides the candidate's code
    (a considered row's ``op_fingerprint``)."""
    if op.builtin:
        return None
    found = _OP_MEMO.get(id(op))
    if found is not None and found[0] is op:
        return found[1]
    digest = hashlib.blake2b(digest_size=FINGERPRINT_HEX // 2)
    for part, fn in (("reference", op.reference), ("validate", op.validate),
                     ("budget", op.budget), ("gate_inputs", op.user_gate_inputs)):
        digest.update(f"\0{part}\0".encode())
        if fn is None:
            continue
        if str(getattr(fn, "__module__", "")).split(".")[0] == "pytest_arbiter":
            # the package's default: its name, not its code (an upgrade is no new op)
            digest.update(f"{fn.__module__}.{getattr(fn, '__qualname__', '')}".encode())
        else:
            _hash_callable(digest, fn)
    digest.update(f"\0out_dtype\0{op.out_dtype}".encode())
    text = digest.hexdigest()
    _OP_MEMO[id(op)] = (op, text)
    return text


_OP_MEMO: dict[int, tuple[Op, str]] = {}


def _fingerprint(candidate: Candidate) -> str:
    digest = hashlib.blake2b(digest_size=FINGERPRINT_HEX // 2)
    if isinstance(candidate, FunctionCandidate):
        _hash_callable(digest, candidate.fn)
    else:
        for klass in type(candidate).__mro__:
            if klass is Candidate or klass is object:
                break
            for name in sorted(vars(klass)):
                member = vars(klass)[name]
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, property):
                    member = member.fget
                if isinstance(member, types.FunctionType):
                    digest.update(f"\0method {klass.__name__}.{name}\0".encode())
                    _hash_callable(digest, member)
    for hook in ("fingerprint_parts", "source"):
        offered = getattr(candidate, hook, None)
        if callable(offered):
            try:
                parts = offered()
            except Exception as exc:  # never into a dispatch: the entry just never matches
                digest.update(f"\0{hook} raised {type(exc).__name__}: {exc}\0".encode())
                continue
            for part in [parts] if isinstance(parts, (str, bytes)) else parts:
                digest.update(f"\0{hook}\0".encode())
                digest.update(part if isinstance(part, bytes) else str(part).encode())
    if candidate.version is not None:
        digest.update(f"\0version\0{candidate.version}".encode())
    return digest.hexdigest()


MAX_HELPERS = 64
"""At most this many helper functions a kernel calls are hashed with it."""


def _hash_callable(digest: Any, fn: Callable[..., Any],
                   seen: set[int] | None = None) -> None:
    """Hash what ``fn`` runs: its code, and the code of the plain Python functions of its
    own package that it reaches through its global names and closure (a shared tile
    helper, a launch wrapper): an edit to one of them changes the fingerprint."""
    seen = set() if seen is None else seen
    seen.add(id(fn))
    inner = _python_function(fn)
    if inner is not None:  # compiled or cached: what it was made of, and its own call
        digest.update(b"\0wraps\0")
        _hash_callable(digest, inner, seen)
        for library in _versions([fn], inner):
            digest.update(f"\0compiled by {library}\0".encode())  # numba's version
        options = getattr(fn, "targetoptions", None)  # numba's: fastmath=True and such
        if isinstance(options, dict):
            digest.update(f"\0options\0{_stable_repr(tuple(sorted(options.items())))}"
                          .encode())
        call = next((vars(k)["__call__"] for k in type(fn).__mro__
                     if "__call__" in vars(k)), None)
        if isinstance(call, types.FunctionType):  # a decorator class of the user's
            digest.update(b"\0wrapper\0")
            _hash_callable(digest, call, seen)
        return
    if isinstance(fn, functools.partial):
        _hash_callable(digest, fn.func, seen)
        digest.update(f"\0partial\0{_stable_repr(fn.args)}"
                      f"{_stable_repr(tuple(sorted(fn.keywords.items())))}".encode())
        return
    code = getattr(fn, "__code__", None)
    if code is None:  # a callable object: its class's __call__
        fn = vars(type(fn)).get("__call__", fn)
        code = getattr(fn, "__code__", None)
    if isinstance(code, types.CodeType):
        _hash_code(digest, code, getattr(fn, "__doc__", None))
        for name, literal in _literals_read(fn, code):
            digest.update(f"\0global {name} = {literal}\0".encode())
        for library in _libraries_named(fn, code):
            digest.update(f"\0library {library}\0".encode())
        try:
            helpers = _helpers(fn, code)
        except Exception as exc:  # a module whose lookups raise: hashed by what we know
            digest.update(f"\0helpers unreadable {type(exc).__name__}\0".encode())
            return
        for name, helper in helpers:
            if id(helper) not in seen and len(seen) <= MAX_HELPERS:
                digest.update(f"\0calls {name}\0".encode())
                _hash_callable(digest, helper, seen)
        return
    # a builtin or a C function (np.matmul): its name; its library's version is in
    # the environment
    module = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(type(fn))
    digest.update(f"\0builtin\0{module}.{name}".encode())


def _helpers(fn: Any, code: types.CodeType) -> list[tuple[str, Any]]:
    """The Python functions (and partials of them) of the user's own code that ``fn``'s
    code names as globals, reaches as attributes of a module it names (``helpers.impl``),
    or holds in its closure, by name. The user's own code: the kernel's own top-level
    package, or any module not installed with Python or in site-packages."""
    home = str(getattr(fn, "__module__", "") or "").split(".")[0]
    names = sorted(_names(code))
    found: dict[str, Any] = {}
    namespace = getattr(fn, "__globals__", None) or {}
    for name in names:
        obj = namespace.get(name)
        if isinstance(obj, types.ModuleType) and _own_code(obj, home):
            members = vars(obj)  # never the module's __getattr__ (a lazy import)
            for attr in names:
                member = members.get(attr)
                if member is not None:
                    found.setdefault(f"{name}.{attr}", member)
        else:
            found.setdefault(name, obj)
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or (),
                          strict=False):
        try:
            found[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    out = []
    for name, obj in sorted(found.items()):
        target = obj.func if isinstance(obj, functools.partial) else obj
        target = _python_function(target) or target
        if isinstance(target, types.FunctionType) and _own_code(target, home):
            out.append((name, obj))
    return out


def _literals_read(fn: Any, code: types.CodeType) -> list[tuple[str, str]]:
    """The tuning knobs ``fn``'s code reads (:mod:`~pytest_arbiter.extend.literals`),
    itself or as an attribute of another module of the user's (``cfg.PASSES``), with
    the literals their module's code sets them to."""
    namespace = getattr(fn, "__globals__", None) or {}
    module = namespace.get("__name__")
    if not isinstance(module, str):
        return []
    home = module.split(".")[0]

    def own(obj: types.ModuleType) -> bool:
        return _own_code(obj, home)

    found: list[tuple[str, str]] = []
    names = sorted(_names(code))
    for name in names:
        values = knob(namespace, name, own)
        if values is not None:
            found.append((name, _stable_repr(values)))
        obj = namespace.get(name)
        if isinstance(obj, types.ModuleType) and own(obj):
            for attr in names:
                theirs = knob(vars(obj), attr, own)
                if theirs is not None:
                    found.append((f"{name}.{attr}", _stable_repr(theirs)))
    return found


def _libraries_named(fn: Any, code: types.CodeType) -> list[str]:
    """The installed libraries ``fn``'s code names as globals or holds in its closure,
    with their versions (:mod:`~pytest_arbiter.extend.libraries`)."""
    namespace = getattr(fn, "__globals__", None) or {}
    objects = [namespace[name] for name in sorted(_names(code)) if name in namespace]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            objects.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    return _versions(objects, fn)


def _versions(objects: list[Any], fn: Any) -> list[str]:
    """The installed libraries ``objects`` belong to, with their versions, where ``fn``'s
    own package (and the user's other modules) is not one."""
    home = str(getattr(fn, "__module__", "") or "").split(".")[0]
    return library_versions(objects, home, lambda module: _own_code(module, home))


def _python_function(obj: Any) -> types.FunctionType | None:
    """The plain Python function a compiled or cached wrapper that is not one itself was
    made of: ``py_func`` (numba's ``@njit`` dispatchers), ``__wrapped__`` (a
    ``functools.lru_cache``, ``jax.jit``, a decorator class's instance: its own
    ``__call__`` is hashed beside it); ``None`` for anything else. A function made by a
    decorator is hashed as itself: its closure holds what it wraps."""
    if isinstance(obj, (types.FunctionType, functools.partial, types.ModuleType, type)):
        return None  # a module's or a class's attributes are not looked up
    for attr in ("py_func", "__wrapped__"):
        try:
            inner = getattr(obj, attr, None)
        except Exception:  # a proxy whose lookups raise: not a wrapper we can read
            return None
        if isinstance(inner, types.FunctionType):
            return inner
    return None


def _own_code(obj: Any, home: str) -> bool:
    """Whether ``obj`` (a function or a module) is the user's code, not a library's."""
    if isinstance(obj, types.ModuleType):
        module = str(vars(obj).get("__name__") or "")
        path = vars(obj).get("__file__")
        if module.split(".")[0] == home:
            return True
        return bool(path) and not str(path).startswith(_library_paths())
    module = str(getattr(obj, "__module__", None) or "")
    if module.split(".")[0] == home:
        return True
    code = getattr(obj, "__code__", None)
    path = code.co_filename if code is not None else getattr(obj, "__file__", None)
    if not path:
        return False
    return not str(path).startswith(_library_paths())


@functools.cache
def _library_paths() -> tuple[str, ...]:
    """Where installed libraries and the standard library live: their code is versioned
    by the environment, not fingerprinted."""
    import site
    import sysconfig

    paths = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib",
                                                      "platlib")}
    paths.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    paths.add(site.getusersitepackages())
    return tuple(sorted(os.path.join(p, "") for p in paths if p))


def _names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and its nested code objects use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _hash_code(digest: Any, code: types.CodeType, doc: str | None = None) -> None:
    digest.update(b"\0code\0")
    digest.update(code.co_code)
    digest.update(repr((code.co_argcount, code.co_kwonlyargcount, code.co_names)).encode())
    consts = code.co_consts
    if doc is not None and consts and consts[0] == doc:
        consts = consts[1:]  # the docstring: documentation, not behaviour
    for const in consts:
        if isinstance(const, types.CodeType):
            _hash_code(digest, const)
        else:
            digest.update(b"\0const\0")
            digest.update(_stable_repr(const).encode())


def _stable_repr(value: Any) -> str:
    """``repr`` that does not depend on the process: a set's order does (string hashing
    is randomised), so its items are sorted; a list's, dict's and tuple's items are
    written the same way."""
    if isinstance(value, (set, frozenset)):
        return (f"{type(value).__name__}({{"
                + ", ".join(sorted(map(_stable_repr, value))) + "})")
    if isinstance(value, (tuple, list)):
        inner = ", ".join(map(_stable_repr, value))
        return f"({inner},)" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_stable_repr(k)}: {_stable_repr(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
        return f"{value.__module__}.{value.__qualname__}"
    if type(value).__module__ == "numpy" and hasattr(value, "tobytes"):
        digest = hashlib.blake2b(value.tobytes(), digest_size=8).hexdigest()
        return f"ndarray({value.dtype}, {getattr(value, 'shape', ())}, {digest})"
    return _ADDRESS.sub("", repr(value))


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def current_environment(target: str) -> dict[str, str]:
    """What timings on ``target`` are valid under, here: ``device_name``, ``python``,
    ``numpy``, ``blas`` (when NumPy says cheaply), and on a GPU target, when CuPy is
    importable, ``cupy``, the runtime CuPy was built against (``cuda_runtime`` or
    ``rocm_runtime``) and the one loaded here (``cuda_runtime_local``), ``driver``,
    ``nvrtc``, ``blas_library`` (cuBLAS or hipBLAS), ``cupy_tf32`` and
    ``nvidia_tf32_override``.

    Worked out once per target and process. CuPy is never imported for the CPU target.
    """
    return dict(_environment(target))


def forget_environment() -> None:
    """Work the environment out again on the next call (tests swap CuPy in and out)."""
    _environment.cache_clear()


@functools.cache
def _environment(target: str) -> tuple[tuple[str, str], ...]:
    import numpy as np

    from pytest_arbiter.extend.backends import BACKENDS, DeviceInfo
    from pytest_arbiter.extend.device import probe_device

    env = {"python": platform.python_version(), "numpy": np.__version__}
    blas = _numpy_blas()
    if blas:
        env["blas"] = blas
    found = probe_device(target)
    if isinstance(found, DeviceInfo):
        env["device_name"] = found.name
    backend = BACKENDS.for_target(target)
    if backend is not None:
        env.update(backend.environment(target))
    return tuple(sorted(env.items()))


def _numpy_blas() -> str:
    """``name version`` of the BLAS NumPy was built with (NumPy >= 1.26), else ``""``."""
    import numpy as np

    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return " ".join(str(blas[k]) for k in ("name", "version") if blas.get(k)).strip()
    except Exception:
        return ""
