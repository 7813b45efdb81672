"""Kernel libraries and small readers for tests/test_pick_trust.py (issue 24, "the pick
you can trust").

Every kernel here is a busy wait: it spins on ``time.perf_counter`` until its time has
passed, then returns the reference's result. Each kernel is a function of its own with
its wait written as a constant in its code, so the code fingerprint follows the wait:
rewrite the constant and the kernel counts as changed code.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

HEADER = '''
import os
import time

import numpy as np
import pytest_arbiter


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
'''


def op_line(op: str) -> str:
    return f"\npytest_arbiter.op({op!r}, reference=lambda x: x * 2.0)\n"


def kernel(op: str, name: str, ms: float, *, result: str = "x * 2.0",
           options: str = "", when: str | None = None) -> str:
    """The source of one busy-wait candidate of ``op`` named ``name`` taking ``ms``.

    ``result``: what it returns (``x * 3.0`` is wrong: the F4 gate rejects it);
    ``options``: more keyword arguments of ``candidate(...)``; ``when``: a condition
    under which it is registered at all (else the module never registers it, as if
    the package it needs were not installed)."""
    decorator = f"pytest_arbiter.candidate({op!r}, target=\"cpu\", name={name!r}{options})"
    if when is not None:
        decorator = f"({decorator} if {when} else (lambda fn: fn))"
    body = f"    _spin({ms / 1000!r})\n" if ms > 0 else ""
    return f"\n\n@{decorator}\ndef {name}(x):\n{body}    return {result}\n"


def library(op: str, kernels: Mapping[str, float], **per_kernel: dict[str, Any]) -> str:
    """A module registering ``op`` and one busy-wait kernel per ``name: ms``;
    ``per_kernel[name]`` holds more keyword arguments of :func:`kernel` for one."""
    parts = [HEADER, op_line(op)]
    parts.extend(kernel(op, name, ms, **per_kernel.get(name, {}))
                 for name, ms in kernels.items())
    return "".join(parts)


def dispatch_test(module: str, op: str, sizes: Iterable[int] = (16,),
                  name: str = "test_dispatch") -> str:
    """A test module with one test dispatching ``op`` once per size."""
    calls = "".join(
        f"    x = np.arange({n}, dtype=np.float64)\n"
        f"    assert (pytest_arbiter.dispatch({op!r}, x) == x * 2.0).all()\n"
        for n in sizes)
    return (f"import numpy as np\nimport pytest_arbiter\n\nimport {module}  # noqa: F401\n"
            f"\n\ndef {name}():\n{calls}")


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``pytest-arbiter ARGS`` as this interpreter runs it, in ``cwd``."""
    return subprocess.run([sys.executable, "-m", "pytest_arbiter.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ})


def histogram(path: Path) -> dict[tuple[str, str, str], int]:
    """A histogram file's counts as ``{(op, selected, outcome): count}``."""
    doc = json.loads(path.read_text())
    return {(e["op"], e["selected"], e["outcome"]): e["count"] for e in doc["entries"]}


def file_entry(path: Path, op: str) -> dict[str, Any]:
    """The one entry of ``op`` in a cache file, as the file's JSON holds it."""
    found = [e for e in json.loads(path.read_text())["entries"] if e["op"] == op]
    assert len(found) == 1, found
    return found[0]


def shown_entry(cwd: Path, cache: str, op: str) -> dict[str, Any]:
    """The one entry of ``op`` in ``pytest-arbiter show --json CACHE``."""
    done = cli(cwd, "show", "--json", cache)
    assert done.returncode == 0, done.stdout + done.stderr
    found = [e for e in json.loads(done.stdout) if e["op"] == op]
    assert len(found) == 1, done.stdout
    return found[0]


def row_median(row: Mapping[str, Any]) -> float:
    """A ranking row's median, in the cache file's form or in ``show --json``'s."""
    stats = row.get("stats", row)
    return float(stats["median_ns"])


def near(text: str, *tokens: str, window: int = 3) -> bool:
    """Whether some ``window`` consecutive lines of ``text`` hold every token."""
    lines = text.splitlines()
    return any(all(t in "\n".join(lines[i:i + window]) for t in tokens)
               for i in range(len(lines)))


GATE_LINE = re.compile(r"^(NEW|known) (\w+): (target=\S+ op=\S+ candidate=\S+) "
                       r"\((\d+) dispatches")


def gate_counts(output: str) -> list[tuple[str, str, int]]:
    """The (outcome, entry, dispatches) of each entry ``pytest-arbiter gate`` printed."""
    found = [GATE_LINE.match(line) for line in output.splitlines()]
    return sorted((m.group(2), m.group(3), int(m.group(4))) for m in found if m)
