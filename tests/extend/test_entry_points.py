"""A package installed with pip brings a backend and a candidate through the
``pytest_arbiter`` entry-point group, and a plain ``pytest`` run uses them, with no
import of the package in its tests.

The package is built by a twenty-line in-tree PEP 517 backend, so the install needs
neither the network nor setuptools' ``wheel`` support.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from tests.factories import ROOT

pytestmark = pytest.mark.slow

BACKEND = '''
import base64, hashlib, zipfile

NAME, VERSION = "acme_npu_kernels", "0.1"
DIST = f"{NAME}-{VERSION}.dist-info"
FILES = {
    f"{NAME}/__init__.py": open(f"{NAME}/__init__.py").read(),
    f"{DIST}/METADATA": f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n",
    f"{DIST}/WHEEL": "Wheel-Version: 1.0\\nGenerator: tiny\\nRoot-Is-Purelib: true\\n"
                     "Tag: py3-none-any\\n",
    f"{DIST}/entry_points.txt": f"[pytest_arbiter]\\nacme = {NAME}\\n",
}


def _digest(text):
    raw = hashlib.sha256(text.encode()).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    record = "".join(f"{p},{_digest(t)},{len(t.encode())}\\n" for p, t in FILES.items())
    with zipfile.ZipFile(f"{wheel_directory}/{name}", "w") as whl:
        for path, text in FILES.items():
            whl.writestr(path, text)
        whl.writestr(f"{DIST}/RECORD", record + f"{DIST}/RECORD,,\\n")
    return name
'''

PLUGIN = '''
"""Acme's NPU lane, simulated with NumPy: a backend and its candidate."""
import numpy as np
from pytest_arbiter import Backend, DeviceInfo, FunctionCandidate, hookimpl


def npu_matmul(a, b):
    return np.matmul(a, b)


def host_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class AcmeNpu(Backend):
    name, targets = "acme", ("acme_npu",)

    def probe(self, target):
        return DeviceInfo("acme-npu-v2", "Acme NPU v2 (simulated)")

    def candidates(self):
        return [FunctionCandidate(npu_matmul, "acme_npu_matmul", "matmul", "acme_npu", 0,
                                  None, None)]


@hookimpl
def pytest_arbiter_add_backends():
    return [AcmeNpu()]


@hookimpl
def pytest_arbiter_add_candidates():
    return [FunctionCandidate(host_softmax, "acme_host_softmax", "softmax", "cpu", 7,
                              None, None)]
'''

TESTS = '''
import numpy as np
import pytest


@pytest.mark.arbiter_device("acme-npu-v2")
def test_on_the_npu(arbiter):
    a = np.ones((4, 4), np.float32)
    np.testing.assert_allclose(arbiter.dispatch("matmul", a, a, target="acme_npu"), a @ a)


def test_the_added_cpu_candidate(arbiter):
    arbiter.dispatch("softmax", np.ones((2, 8), np.float32))
'''


def environment_beside_this_one(venv: Path) -> str:
    """A virtual environment that sees this interpreter's packages (pytest, numpy, the
    plugins), whether this interpreter is a system one or itself a virtual environment's:
    ``--system-site-packages`` alone reaches the base interpreter's only. Its Python."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    python = str(venv / "bin" / "python")
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = subprocess.run([python, "-c", where], capture_output=True, text=True,
                             check=True).stdout.strip()
    ours = [p for p in {*site.getsitepackages(), sysconfig.get_path("purelib")}
            if os.path.isdir(p)]
    # a .pth line that imports runs at start-up: addsitedir also reads those folders'
    # own .pth files (an editable install's finder)
    Path(purelib, "outer_environment.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in sorted(ours)))
    return python


def test_an_installed_package_adds_a_backend_and_a_candidate(tmp_path: Path) -> None:
    pkg = tmp_path / "acme"
    (pkg / "acme_npu_kernels").mkdir(parents=True)
    (pkg / "acme_npu_kernels" / "__init__.py").write_text(PLUGIN)
    (pkg / "tiny_backend.py").write_text(BACKEND)
    (pkg / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = []
        build-backend = "tiny_backend"
        backend-path = ["."]
    '''))
    python = environment_beside_this_one(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "PIP_")) and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)  # the pytest_arbiter of this checkout
    installed = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps",
                                "--no-build-isolation", "--no-index", str(pkg)],
                               capture_output=True, text=True, env=env, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_kernels.py").write_text(TESTS)
    ran = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "-rs",
                          "-p", "no:randomly", "--arbiter-histogram=h.json"], cwd=project,
                         capture_output=True, text=True, env=env, timeout=300)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    assert "2 passed" in ran.stdout
    assert "arbiter: devices acme-npu-v2, cpu-" in ran.stdout
    entries = json.loads((project / "h.json").read_text())["entries"]
    assert sorted((e["target"], e["selected"], e["outcome"]) for e in entries) == [
        ("acme_npu", "acme_npu_matmul", "won"), ("cpu", "acme_host_softmax", "won")]
