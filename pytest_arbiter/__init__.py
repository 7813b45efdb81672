"""pytest-arbiter: gate, measure and arbitrate competing compute kernels.

The public names are listed once, in ``__init__.pyi``: type checkers read it, and this
module reads it to import each name on first use (PEP 562), so that pytest loading the
plugin into a run that never dispatches imports neither NumPy nor the kernels. What lives
only in a submodule is internal. Importing the package never imports pytest or CuPy.
"""

from __future__ import annotations

import ast
import importlib
from importlib import resources
from typing import Any

__version__ = "0.1.0"


def _export_table() -> dict[str, str]:
    """Each public name and its module, from the stub's ``from .module import name``
    lines (read as a package resource, so an installed zip works too)."""
    text = resources.files(__name__).joinpath("__init__.pyi").read_text(encoding="utf-8")
    return {alias.name: f"{__name__}.{node.module}"
            for node in ast.parse(text).body
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
            for alias in node.names}


_HOME = _export_table()
__all__ = [*_HOME, "__version__"]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}", name=name)
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain module attribute
    return value


def __dir__() -> list[str]:
    """The public names and the module's dunders, not what it imports for itself."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__"))})
