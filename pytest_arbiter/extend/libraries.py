"""The installed libraries a kernel's code names, with their versions.

A kernel that calls ``fastlib.lse`` runs fastlib's code, which the fingerprint cannot
hash: an upgrade (faster, slower, or wrong) must still make the entry stale, and have
the kernel gated and timed again, or production would serve the new code on the old
verdict. So a function's fingerprint holds, for each installed library its code names
(a module, or a function, class or object of one: a numba dispatcher names numba), the
library's version: its distribution's (``importlib.metadata``), else its
``__version__``, else a hash of the file the named object lives in. Left out: the
standard library (the Python version is the environment's), and the libraries whose
version the environment records (NumPy, CuPy) or that are this package.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

IN_ENVIRONMENT = frozenset({"numpy", "cupy", "cupyx", "cupy_backends", "pytest_arbiter"})
"""Top-level packages whose version is part of the environment (or is this package)."""


def library_versions(objects: Iterable[Any], home: str,
                     own: Callable[[types.ModuleType], bool]) -> list[str]:
    """``name version`` of each installed library one of ``objects`` belongs to (sorted,
    once each); ``home`` is the kernel's own top-level package and ``own(module)`` tells
    the user's modules from installed ones."""
    found: dict[str, str] = {}
    for obj in objects:
        for top, path in _libraries_of(obj):
            if top == home or top in found or not _installed(top, own):
                continue
            found[top] = _version(top, path)
    return [f"{top} {version}" for top, version in sorted(found.items())]


_PLAIN = (str, int, float, bool, bytes, tuple, list, dict, set, frozenset, type(None))


def _libraries_of(obj: Any) -> list[tuple[str, str | None]]:
    """The top-level packages ``obj`` comes from, each with the file it lives in where
    known: its own module (a module's name; a function's, class's or C function's
    ``__module__``: ``from fastlib import lse``) and, for an object of a class, its
    class's (a numba dispatcher is numba's, a ufunc NumPy's). Builtins, plain values,
    the standard library and the environment's libraries name none."""
    if isinstance(obj, _PLAIN):
        return []
    if isinstance(obj, types.ModuleType):
        path = vars(obj).get("__file__")
        named = [(str(vars(obj).get("__name__") or ""), path)]
    else:
        code = getattr(obj, "__code__", None)
        path = code.co_filename if isinstance(code, types.CodeType) else None
        named = [(str(getattr(obj, "__module__", "") or ""), path)]
        if not isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type)):
            named.append((str(type(obj).__module__ or ""), None))
    out = []
    for module, where in named:
        top = module.split(".")[0]
        if (top and top not in sys.stdlib_module_names and top != "builtins"
                and not top.startswith("_") and top not in IN_ENVIRONMENT):
            out.append((top, where if isinstance(where, str) else None))
    return out


def _installed(top: str, own: Callable[[types.ModuleType], bool]) -> bool:
    module = sys.modules.get(top)
    return isinstance(module, types.ModuleType) and not own(module)


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()


@functools.cache
def _version(top: str, path: str | None) -> str:
    """The version of installed package ``top``; ``path``: the file of the object the
    kernel names, hashed where the package says no version."""
    found = _distribution_version(top)
    if found is not None:
        return found
    module = sys.modules.get(top)
    version = getattr(module, "__version__", None)
    if isinstance(version, str) and version:
        return version
    path = path or getattr(module, "__file__", None)
    if not isinstance(path, str) or not path:
        return "unknown"  # a namespace package with no distribution: nothing to read
    try:
        with open(path, "rb") as file:
            return "file " + hashlib.blake2b(file.read(), digest_size=8).hexdigest()
    except OSError:
        return "unknown"


def _distribution_version(top: str) -> str | None:
    """The version of the distribution that installed ``top``: the one named as the
    package first (scipy, numba: one lookup), else every distribution that installs it
    (sklearn: scikit-learn; a namespace package such as ``nvidia`` several), sorted, so
    the text is the same on every machine with the same installs."""
    from importlib import metadata

    try:
        return metadata.version(top)
    except metadata.PackageNotFoundError:
        pass
    versions = []
    for dist in sorted(set(_distributions().get(top, ()))):
        try:
            versions.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(versions) or None


def forget() -> None:
    """Look the versions up again (a test that installs a library)."""
    _distributions.cache_clear()
    _version.cache_clear()
