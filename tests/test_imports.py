"""Every module imports alone, in any order, and registers nothing by being imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CODE = """
import importlib, json, pkgutil, random, sys
import pytest_arbiter
names = sorted(m.name for m in pkgutil.walk_packages(pytest_arbiter.__path__,
                                                       "pytest_arbiter."))
random.Random(SEED).shuffle(names)
for name in names:
    importlib.import_module(name)
from pytest_arbiter import hooks
from pytest_arbiter.backends import BACKENDS
from pytest_arbiter.candidates import REGISTRY
print(json.dumps({"modules": len(names), "candidates": sorted(REGISTRY._by_name),
                  "backends": BACKENDS.targets(), "manager": bool(hooks._MANAGER),
                  "cupy": "cupy" in sys.modules}))
"""


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_every_module_imports_in_random_order_and_registers_nothing(seed: int) -> None:
    out = subprocess.run([sys.executable, "-c", CODE.replace("SEED", str(seed))],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr  # an import cycle fails here, with its trace
    found = json.loads(out.stdout)
    assert found["modules"] > 40
    assert found == {"modules": found["modules"], "candidates": [], "backends": [],
                     "manager": False, "cupy": False}


def test_the_public_names_are_listed_alike_in_the_three_places() -> None:
    """``__init__`` lists the public names for its lazy lookup (``_HOME``), for
    ``import *`` and linters (``__all__``) and for type checkers (the TYPE_CHECKING
    imports): the three must agree, and each name must resolve."""
    import ast
    import inspect

    import pytest_arbiter

    tree = ast.parse(inspect.getsource(pytest_arbiter))
    typed: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom):
                    typed.update(alias.name for alias in sub.names)
    home = set(pytest_arbiter._HOME)
    assert set(pytest_arbiter.__all__) - {"__version__"} == home
    assert typed == home
    for name in sorted(home):
        assert getattr(pytest_arbiter, name) is not None
