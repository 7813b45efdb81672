"""pytest-arbiter: gate, measure and arbitrate competing compute kernels.

The public names are listed once, in ``__init__.pyi``: type checkers read it, and this
module reads it to import each name on first use (PEP 562, with ``lazy_loader``), so that
pytest loading the plugin into a run that never dispatches imports neither NumPy nor the
kernels. Every module the stub does not name is internal. Importing the package never
imports pytest or CuPy.
"""

from __future__ import annotations

from typing import Any

import lazy_loader

__version__ = "0.1.0"

_lazy_getattr, _lazy_dir, __all__ = lazy_loader.attach_stub(__name__, __file__)


def __getattr__(name: str) -> Any:
    try:
        value = _lazy_getattr(name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value  # the next lookup is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
