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
        top, path = _library_of(obj)
        if not top or top == home or top in found or not _installed(top, own):
            continue
        found[top] = _version(top, path)
    return [f"{top} {version}" for top, version in sorted(found.items())]


def _library_of(obj: Any) -> tuple[str, str | None]:
    """The top-level package ``obj`` comes from and the file it lives in (empty: none
    to version, a builtin or the standard library)."""
    if isinstance(obj, types.ModuleType):
        module, path = str(vars(obj).get("__name__") or ""), vars(obj).get("__file__")
    elif isinstance(obj, (types.FunctionType, type)):
        module = str(getattr(obj, "__module__", "") or "")
        code = getattr(obj, "__code__", None)
        path = code.co_filename if code is not None else None
    elif isinstance(obj, (types.BuiltinFunctionType, str, int, float, bool, bytes,
                          tuple, list, dict, set, frozenset, type(None))):
        return "", None
    else:  # an object of a library's class (a numba dispatcher, a ufunc-like callable)
        module, path = str(type(obj).__module__ or ""), None
    top = module.split(".")[0]
    if not top or top in sys.stdlib_module_names or top == "builtins" or top.startswith("_"):
        return "", None
    if top in IN_ENVIRONMENT:
        return "", None
    return top, path if isinstance(path, str) else None


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
    try:
        with open(str(path), "rb") as file:
            return "file " + hashlib.blake2b(file.read(), digest_size=8).hexdigest()
    except (OSError, TypeError):
        return "unknown"


def _distribution_version(top: str) -> str | None:
    """The version of the distribution that installed ``top``: the one named as the
    package first (scipy, numba: one lookup), the map of every installed distribution
    (sklearn: scikit-learn) only when that misses."""
    from importlib import metadata

    try:
        return metadata.version(top)
    except metadata.PackageNotFoundError:
        pass
    for dist in _distributions().get(top, ()):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def forget() -> None:
    """Look the versions up again (a test that installs a library)."""
    _distributions.cache_clear()
    _version.cache_clear()
