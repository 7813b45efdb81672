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
from pytest_arbiter.extend import hooks
from pytest_arbiter.extend.backends import BACKENDS
from pytest_arbiter.core.candidates import REGISTRY
print(json.dumps({"modules": len(names), "candidates": sorted(REGISTRY._by_name),
                  "backends": BACKENDS.targets(), "manager": bool(hooks._MANAGER),
                  "cupy": "cupy" in sys.modules}))
"""


# a subprocess each: two orders in the quick tier, four in the full run
@pytest.mark.parametrize("seed", [0, 1, pytest.param(2, marks=pytest.mark.slow),
                                  pytest.param(3, marks=pytest.mark.slow)])
def test_every_module_imports_in_random_order_and_registers_nothing(seed: int) -> None:
    out = subprocess.run([sys.executable, "-c", CODE.replace("SEED", str(seed))],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr  # an import cycle fails here, with its trace
    found = json.loads(out.stdout)
    assert found["modules"] > 40
    assert found == {"modules": found["modules"], "candidates": [], "backends": [],
                     "manager": False, "cupy": False}


def test_the_export_table_is_one_list_and_every_name_resolves() -> None:
    """``__init__.pyi`` is the one list of public names: ``__all__`` is read from it, each
    name resolves to what the stub says it is, and the package's own ``__init__.py``
    names none of them."""
    import ast
    import pathlib

    import pytest_arbiter

    stub = pathlib.Path(pytest_arbiter.__file__).with_suffix(".pyi")
    listed: dict[str, str] = {}
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                assert alias.asname == alias.name, f"{alias.name} is not re-exported"
                listed[alias.name] = f"pytest_arbiter.{node.module}"
    assert len(listed) > 50
    assert sorted(pytest_arbiter.__all__) == sorted([*listed, "__version__"])
    for name, home in listed.items():
        value, expected = getattr(pytest_arbiter, name), getattr(sys.modules[home], name)
        # the same object, or (a module pytester's in-process runs dropped and another
        # test imported again) the same definition
        assert value is expected or _defined(value) == _defined(expected) != (None, None), name
    source = pathlib.Path(pytest_arbiter.__file__).read_text()
    assert not any(f'"{name}"' in source for name in listed)
    assert "dispatch" in dir(pytest_arbiter) and "__version__" in dir(pytest_arbiter)
    # what the package imports for itself is not offered (a completer, help())
    assert {n for n in dir(pytest_arbiter) if not n.startswith("__")} == set(listed)
    with pytest.raises(AttributeError, match="module 'pytest_arbiter' has no attribute"):
        pytest_arbiter.not_a_name  # noqa: B018


def test_the_new_public_key_types_name_their_fields() -> None:
    """Keys are named tuples: read by field, and a plain tuple in the same order still
    finds the same count or entry."""
    import numpy as np

    from pytest_arbiter import (
        Arbiter,
        CacheKey,
        CandidateRegistry,
        DispatchHistogram,
        FunctionCandidate,
        HistogramKey,
    )

    hist = DispatchHistogram({("cpu", "matmul", "blas", "won"): 2})
    (key,) = hist.counts()
    assert isinstance(key, HistogramKey)
    assert (key.target, key.op, key.selected, key.outcome) == ("cpu", "matmul", "blas", "won")
    assert hist.counts()[("cpu", "matmul", "blas", "won")] == 2

    reg = CandidateRegistry()
    reg.add(FunctionCandidate(lambda a, b: a @ b, "at", "matmul", "cpu", 0, None, None))
    arb = Arbiter(registry=reg, mode="tune")
    a = np.ones((8, 8), np.float32)
    arb.dispatch("matmul", a, a)
    (entry_key,) = [e.key for e in arb.cache.entries()]
    assert isinstance(entry_key, CacheKey)
    assert (entry_key.target, entry_key.op, entry_key.dtype) == ("cpu", "matmul", "float32")
    assert arb.cache.get(tuple(entry_key)) is arb.cache.get(entry_key)


def _defined(value: object) -> tuple[object, object]:
    return getattr(value, "__module__", None), getattr(value, "__qualname__", None)
