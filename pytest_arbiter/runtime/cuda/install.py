"""What the GPU lane needs installed, read from the installed distributions alone.

Standard library only, and runnable as a script from a checkout before the package is
installed (``python pytest_arbiter/runtime/cuda/install.py ...``, what ``ci/gpu-check.sh``
does): which CuPy extra fits this machine, which CuPy distributions conflict, and
whether everything the package and its GPU check import is already there (a GPU image
that reaches no package index).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import sys
from collections.abc import Callable, Mapping, Sequence

CUPY_DISTRIBUTIONS = (
    "cupy", "cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy-rocm-7-0", "cupy-rocm-7-1",
    "cupy-rocm-6-0", "cupy-rocm-5-0", "amd-cupy",
)
"""CuPy distributions that install the same ``cupy`` package: at most one may be present
(CuPy 14 warns at import when it finds several of its known names)."""

EXTRA_OF = {"cupy-cuda12x": "cuda12", "cupy-cuda13x": "cuda13", "cupy-rocm-7-0": "rocm"}
"""The pytest-arbiter extra that installs each CuPy distribution (with ``[ctk]``)."""

TOOLKIT_DISTRIBUTIONS = {"nvidia-cuda-nvrtc-cu12": 12, "nvidia-cuda-nvrtc": 13}
"""NVIDIA's NVRTC wheels (what ``cupy-cuda1Nx[ctk]`` brings), and the CUDA major of each
(the CUDA 13 wheels dropped the ``-cu13`` suffix; their version says the major)."""

RUNTIME_REQUIREMENTS = (
    "numpy>=1.24", "ml_dtypes>=0.3", "pytest>=7.4", "pluggy>=1.3", "filelock>=3.12",
    "junitparser>=3.1", "msgspec>=0.18.6",
)
"""``[project] dependencies`` of pyproject.toml (a test keeps the two in step)."""

BUILD_REQUIREMENTS = ("setuptools>=77",)
"""``[build-system] requires``: an offline editable install builds with what is here."""

CHECK_REQUIREMENTS = ("cupy>=14", "hypothesis>=6.90")
"""What the GPU check itself runs on: CuPy 14 (bfloat16 arrays) and the test modules'
imports; ``cupy`` stands for whichever CuPy distribution is installed."""

Version = Callable[[str], "str | None"]


def installed_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or ``None``."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def installed_cupy(version: Version | None = None) -> dict[str, str]:
    """The CuPy distributions installed here (``version``: how to read one, by default
    :func:`installed_version`), with their versions."""
    read = version or installed_version
    found = {d: read(d) for d in CUPY_DISTRIBUTIONS}
    return {d: v for d, v in found.items() if v is not None}


def duplicate_reason(installed: Mapping[str, str]) -> str | None:
    """Why CuPy cannot be trusted when several of its distributions are installed."""
    if len(installed) < 2:
        return None
    names = ", ".join(sorted(installed))
    return (f"several CuPy distributions are installed ({names}); they overwrite each "
            f"other's files: pip uninstall -y {' '.join(sorted(installed))}, then install "
            "one extra (ci/gpu-check.sh does both)")


def _major(version: str | None) -> int | None:
    found = re.match(r"(\d+)", version or "")
    return int(found.group(1)) if found else None


def toolkit_major(version: Version | None = None) -> int | None:
    """The CUDA major of NVIDIA's NVRTC wheel installed here (12 or 13), else ``None``."""
    read = version or installed_version
    for dist, major in TOOLKIT_DISTRIBUTIONS.items():
        found = read(dist)
        if found is not None:
            return _major(found) if major == 13 else major
    return None


def choose_cuda_extra(driver_major: int | None, installed: Mapping[str, str],
                      local_toolkit: int | None) -> tuple[str, str]:
    """``(extra, why)``: ``cuda12`` or ``cuda13`` for a driver that supports CUDA
    ``driver_major``, following what is installed: the CuPy already there, else the
    toolkit there (NVIDIA's wheels or a local CUDA), else the driver. A CUDA 13 stack
    needs a CUDA 13 driver; on an older one the choice falls back to 12, saying so.
    """
    limit = driver_major if driver_major is not None else 12
    for dist, extra in (("cupy-cuda13x", "cuda13"), ("cupy-cuda12x", "cuda12")):
        if dist in installed:
            major = 13 if extra == "cuda13" else 12
            if major <= limit:
                return extra, f"{dist} {installed[dist]} is installed"
            return "cuda12", (f"{dist} is installed but the driver supports CUDA {limit} "
                              f"only, so it is replaced by cupy-cuda12x")
    if local_toolkit in (12, 13):
        if local_toolkit <= limit:
            return f"cuda{local_toolkit}", f"a CUDA {local_toolkit} toolkit is installed"
        return "cuda12", (f"a CUDA {local_toolkit} toolkit is installed but the driver "
                          f"supports CUDA {limit} only")
    if limit >= 13:
        return "cuda13", f"the driver supports CUDA {limit}"
    return "cuda12", f"the driver supports CUDA {limit}"


def conflicts(keep: str, installed: Mapping[str, str]) -> list[str]:
    """The CuPy distributions to uninstall before installing ``keep``."""
    return sorted(d for d in installed if d != keep)


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:4])


def requirement_problem(requirement: str, version: Version | None = None,
                        cupy: Mapping[str, str] | None = None) -> str | None:
    """Why ``name>=floor`` is not met here, or ``None`` when it is."""
    version = version or installed_version
    name, _, floor = requirement.partition(">=")
    if name == "cupy":
        found_cupy = installed_cupy(version) if cupy is None else cupy
        if not found_cupy:
            return "no CuPy distribution is installed"
        name = sorted(found_cupy)[0]
    found = version(name)
    if found is None:
        return f"{name} is not installed"
    if floor and _numbers(found) < _numbers(floor):
        return f"{name} {found} is older than {floor}"
    return None


def offline_problems(version: Version | None = None) -> list[str]:
    """What an offline install and the GPU check would miss here (empty: nothing)."""
    wanted = (*RUNTIME_REQUIREMENTS, *BUILD_REQUIREMENTS, *CHECK_REQUIREMENTS)
    problems = [requirement_problem(r, version) for r in wanted]
    duplicate = duplicate_reason(installed_cupy(version))
    return [p for p in [*problems, duplicate] if p is not None]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    extra = sub.add_parser("extra", help="print the CUDA extra to install, then why")
    extra.add_argument("--driver-major", type=int, default=None)
    extra.add_argument("--local-toolkit", type=int, default=None)
    sub.add_parser("conflicts", help="print the CuPy distributions other than the "
                                     "extra's").add_argument("extra")
    sub.add_parser("offline", help="exit 1 and say what is missing for an offline check")
    args = parser.parse_args(argv)
    installed = installed_cupy()
    if args.command == "extra":
        toolkit = toolkit_major() or args.local_toolkit
        chosen, why = choose_cuda_extra(args.driver_major, installed, toolkit)
        print(chosen)
        print(why, file=sys.stderr)
        return 0
    if args.command == "conflicts":
        keep = {v: k for k, v in EXTRA_OF.items()}.get(args.extra, "")
        print(" ".join(conflicts(keep, installed)))
        return 0
    problems = offline_problems()
    for line in problems:
        print(f"offline check: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
