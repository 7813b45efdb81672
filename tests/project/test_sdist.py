"""The source distribution carries its tests: build it, unpack it, and run some of its
tests from the unpacked folder (the package they import is the unpacked one)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.factories import ROOT

pytest.importorskip("build", reason="the sdist test needs the `build` package")

NEEDED = ["LICENSE", "CHANGELOG.md", "README.md", "conftest.py", "tests/__init__.py",
          "tests/conftest.py", "tests/factories.py", "tests/runtime/gpu_gates.py",
          "tools/cuda_emulation/emulator.h",
          "tools/cuda_emulation/emulated_cupy.py", "tools/cuda_emulation/ptx_emulated.cuh",
          "pytest_arbiter/runtime/cuda/kernels/ptx_shim.cuh",
          "bench/run_all.py", "docs/ci.md", "docs/ci/workflow.yml", "ci/gpu-check.sh",
          "pytest_arbiter/py.typed", "pytest_arbiter/cli/report.py"]


@pytest.mark.slow
def test_the_sdist_holds_its_tests_and_they_run(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    built = subprocess.run([sys.executable, "-m", "build", "--sdist", "-o", str(dist),
                            str(ROOT)], capture_output=True, text=True, env=env,
                           timeout=540)
    if built.returncode != 0 and "Could not find a version" in built.stdout + built.stderr:
        pytest.skip("no package index for the build's isolated environment")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (archive,) = dist.glob("pytest_arbiter-*.tar.gz")
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12 and newer
            tar.extractall(tmp_path / "unpacked", filter="data")
        else:
            tar.extractall(tmp_path / "unpacked")
    (top,) = (tmp_path / "unpacked").iterdir()
    missing = [name for name in NEEDED if not (top / name).is_file()]
    assert missing == []
    env.pop("PYTHONPATH", None)
    ran = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "tests/core/test_registration.py", "tests/cli/test_cli_output.py"],
                         cwd=top, capture_output=True, text=True, env=env, timeout=300)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert " passed" in ran.stdout.splitlines()[-1]
