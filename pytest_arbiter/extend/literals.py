"""The tuning knobs of a module: the names its top-level code sets to literals.

A kernel that reads ``PASSES = 6`` runs differently when the line says 8: the knob is
part of its code, and :mod:`pytest_arbiter.extend.fingerprint` hashes it with the
kernel. A knob is a name every store of which, in the module's top-level code, stores a
literal (a number, string, bytes, bool, ``None`` or a tuple of those; ``X = Y = 6`` and
``A, B = 6, 2`` included); or a name bound by
``from module import NAME`` to such a knob of another module. A name set by a
computation anywhere (``THREADS = os.cpu_count()``, a function's ``global`` store)
differs between machines or runs, not between versions of the code: it is no knob.
What is hashed is the literals of the code, never a live value (another module may
set the knob at run time, on some machines only). The module's code is read once per
version of its file.
"""

from __future__ import annotations

import dis
import os
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_SKIPPED = frozenset({"EXTENDED_ARG", "CACHE", "NOP", "RESUME"})
_LOADS = frozenset({"LOAD_CONST", "LOAD_SMALL_INT"})
_STORES = frozenset({"STORE_NAME", "STORE_GLOBAL"})
_PLAIN = (int, float, complex, str, bytes, bool, type(None))


@dataclass(frozen=True)
class _Value:
    value: Any


@dataclass(frozen=True)
class _Module:
    name: str | None  # None: a relative import, not followed


@dataclass(frozen=True)
class Alias:
    """``from module import attr``: the knob is ``module``'s ``attr``."""

    module: str
    attr: str


@dataclass(frozen=True)
class Knobs:
    """A module's knobs: each name to the literals its stores store, in order, and the
    names bound from another module."""

    literals: Mapping[str, tuple[Any, ...]]
    aliases: Mapping[str, Alias]


NO_KNOBS = Knobs({}, {})


def plain(value: Any) -> bool:
    """Whether ``value`` is a literal a knob may hold."""
    if isinstance(value, tuple):
        return all(plain(v) for v in value)
    return isinstance(value, _PLAIN)


def module_knobs(module: str, loader: Any, path: Any) -> Knobs:
    """The knobs of ``module``, read from its code (or its source, where its loader
    has no ``get_code``: pytest's loader of test modules)."""
    try:
        st = os.stat(path)
    except (OSError, TypeError, ValueError):
        return _read(module, loader, path)
    key = (module, str(path), st.st_mtime_ns, st.st_size)
    found = _MEMO.get(key)
    if found is None:
        found = _MEMO[key] = _read(module, loader, path)
    return found


_MEMO: dict[tuple[str, str, int, int], Knobs] = {}


def _read(module: str, loader: Any, path: Any) -> Knobs:
    code = None
    try:
        code = loader.get_code(module)
    except Exception:
        if isinstance(path, str) and path.endswith(".py"):
            try:
                with open(path, "rb") as source:
                    code = compile(source.read(), path, "exec", dont_inherit=True)
            except (OSError, SyntaxError, ValueError):
                code = None
    if not isinstance(code, types.CodeType):  # no source (a notebook, stdin)
        return NO_KNOBS
    literals: dict[str, list[Any]] = {}
    aliases: dict[str, Alias] = {}
    computed = _scan(code, literals, aliases)
    computed |= _global_stores(code)
    return Knobs({n: tuple(v) for n, v in literals.items() if n not in computed},
                 {n: a for n, a in aliases.items() if n not in computed and n not in literals})


def _scan(code: types.CodeType, literals: dict[str, list[Any]],
          aliases: dict[str, Alias]) -> set[str]:
    """Follow the top-level code's stack just far enough to tell a store of a literal
    (or of an imported name) from any other; returns the names stored otherwise."""
    computed: set[str] = set()
    stack: list[Any] = []  # a _Value, a _Module, an Alias, or None: anything else
    for ins in dis.get_instructions(code):
        op = ins.opname
        if op in _SKIPPED:
            continue
        if getattr(ins, "is_jump_target", False):
            stack.clear()  # values from another path meet here: nothing is known
        if op in _LOADS:
            stack.append(_Value(ins.argval))
        elif op == "DUP_TOP" or (op == "COPY" and ins.arg == 1):
            stack.append(stack[-1] if stack else None)
        elif (op == "UNPACK_SEQUENCE" and stack and isinstance(stack[-1], _Value)
              and isinstance(stack[-1].value, tuple) and len(stack[-1].value) == ins.arg):
            stack.extend(_Value(v) for v in reversed(stack.pop().value))
        elif op == "IMPORT_NAME":
            level = stack[-2] if len(stack) >= 2 else None
            del stack[-2:]
            absolute = isinstance(level, _Value) and level.value == 0
            stack.append(_Module(str(ins.argval) if absolute else None))
        elif op == "IMPORT_FROM":
            top = stack[-1] if stack else None
            stack.append(Alias(top.name, str(ins.argval))
                         if isinstance(top, _Module) and top.name else None)
        elif op in _STORES:
            _store(str(ins.argval), stack.pop() if stack else None,
                   literals, aliases, computed)
        else:
            stack.clear()
    return computed


def _store(name: str, value: Any, literals: dict[str, list[Any]],
           aliases: dict[str, Alias], computed: set[str]) -> None:
    if isinstance(value, _Value) and plain(value.value):
        literals.setdefault(name, []).append(value.value)
    elif isinstance(value, Alias):
        aliases[name] = value
    else:
        computed.add(name)


def _global_stores(code: types.CodeType) -> set[str]:
    """The names a function defined in the module stores with ``global``."""
    out: set[str] = set()
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= {i.argval for i in dis.get_instructions(const) if i.opname == "STORE_GLOBAL"}
            out |= _global_stores(const)
    return out


def knob(namespace: Mapping[str, Any], name: str, own: Callable[[types.ModuleType], bool],
         depth: int = 0) -> tuple[Any, ...] | None:
    """The literals of knob ``name`` of the module whose globals are ``namespace``
    (following ``from module import name`` of a loaded module that is ``own`` code),
    or ``None`` when it is no knob: no literal store, or another store. The code's
    literals, never the live value: a value set at run time (a detected tile size)
    differs between machines, and a fingerprint must not."""
    module = namespace.get("__name__")
    if not isinstance(module, str) or depth > 3:
        return None
    knobs = module_knobs(module, namespace.get("__loader__"), namespace.get("__file__"))
    values = knobs.literals.get(name)
    if values is not None:
        return values
    alias = knobs.aliases.get(name)
    other = sys.modules.get(alias.module) if alias is not None else None
    if alias is None or other is None or not own(other):
        return None
    return knob(vars(other), alias.attr, own, depth + 1)

