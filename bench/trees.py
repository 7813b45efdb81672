"""Old and new in one run: a bench script re-run in a fresh process whose
``pytest_arbiter`` is imported from another tree (an older commit, extracted).

    git archive 41364dd | tar -x -C /tmp/before
    python bench/tune_scale.py --quick --before /tmp/before

prints the older tree's figures first, then this tree's. Only the public names of the
top-level package are used by the scripts, so any tree that exports them will do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

BEFORE_HELP = ("also run this script first with pytest_arbiter imported from DIR (an "
               "older tree: git archive COMMIT | tar -x -C DIR), for old and new side by side")


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg says them."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def header() -> str:
    """Which tree is measured, on what, when, under what load."""
    import numpy as np

    import pytest_arbiter

    return (f"{Path(pytest_arbiter.__file__).parent}; Python {sys.version.split()[0]}, "
            f"NumPy {np.__version__}; {os.cpu_count()} CPUs; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
            f"load average {load_average()}")


def without_before(argv: Sequence[str]) -> list[str]:
    """``argv`` less its ``--before DIR`` (or ``--before=DIR``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--before":
            skip = True
        elif not arg.startswith("--before="):
            out.append(arg)
    return out


def run_before(tree: str, script: str, argv: Sequence[str]) -> int:
    """Run ``script`` with ``argv`` (less ``--before``) importing pytest_arbiter from
    ``tree``; its output goes straight to ours. Returns its exit status."""
    root = Path(tree).resolve()
    if not (root / "pytest_arbiter" / "__init__.py").is_file():
        raise SystemExit(f"--before {tree}: no pytest_arbiter package there")
    paths = [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    print(f"== before: {root} ==", flush=True)
    done = subprocess.run([sys.executable, script, *without_before(argv)], env=env,
                          check=False)
    print(f"== after: this tree (the before run exited {done.returncode}) ==", flush=True)
    return done.returncode
