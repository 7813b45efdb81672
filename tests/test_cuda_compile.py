"""Host-free proof: every bundled .cu compiles for each declared NVIDIA arch, GEMMs spill-free.

The compile uses the text and options the runtime hands to CuPy's RawModule
(``KernelSource.text()`` / ``.options()``), with the ``nvcc`` on the machine (ptxas
statistics) or, without one, CuPy's NVRTC (compiles only: no ptxas statistics).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_arbiter.runtime.cuda import sources
from pytest_arbiter.runtime.cuda.sources import KernelSource


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "bin", "nvcc").is_file():
            return str(Path(root, "bin", "nvcc"))
    return None


def nvrtc_reason() -> str | None:
    try:
        import cupy.cuda.compiler  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


NVCC = find_nvcc()


def supported_archs(nvcc: str | None) -> tuple[str, ...]:
    """The declared archs this nvcc can target (``--list-gpu-code``, CUDA 11.x and newer)."""
    if nvcc is None:
        return ()
    try:
        listed = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True,
                                timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return sources.ARCHS
    return tuple(a for a in sources.ARCHS if a in listed)


ARCHS = supported_archs(NVCC)
no_nvcc = pytest.mark.skipif(
    NVCC is None, reason="no nvcc on PATH, CUDA_HOME or /usr/local/cuda: the ptxas "
                         "register and spill figures need nvcc")


@dataclass(frozen=True)
class KernelStats:
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int


ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+a?)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas(log: str) -> dict[tuple[str, str], KernelStats]:
    """(function, arch) -> stats, from ``ptxas -v`` output."""
    stats: dict[tuple[str, str], KernelStats] = {}
    current: tuple[str, str] | None = None
    frame: tuple[int, int, int] | None = None
    for line in log.splitlines():
        if (m := ENTRY.search(line)) is not None:
            current, frame = (m.group(1), m.group(2)), None
        elif (m := FRAME.search(line)) is not None and current is not None:
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := REGS.search(line)) is not None and current is not None:
            stack, stores, loads = frame or (0, 0, 0)
            stats[current] = KernelStats(int(m.group(1)), stores, loads, stack)
            current = None
    return stats


def test_parse_ptxas() -> None:
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
           "ptxas info    : Function properties for k\n"
           "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 122 registers, used 1 barriers\n")
    assert parse_ptxas(log) == {("k", "sm_90"): KernelStats(122, 4, 12, 8)}


@dataclass(frozen=True)
class Compiled:
    source: KernelSource
    returncode: int
    log: str
    stats: dict[tuple[str, str], KernelStats]


def _compile(nvcc: str, src: KernelSource, out_dir: Path) -> Compiled:
    out = out_dir / (src.file + ".fatbin")
    proc = subprocess.run(src.nvcc_command(nvcc, ARCHS, str(out)), capture_output=True,
                          text=True, timeout=300, check=False)
    log = proc.stdout + proc.stderr
    return Compiled(src, proc.returncode, log, parse_ptxas(log))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Compiled]]:
    """Each source compiled once for every declared arch; sources in parallel."""
    assert NVCC is not None
    out_dir = tmp_path_factory.mktemp("cubins")
    with ThreadPoolExecutor(max_workers=len(sources.SOURCES)) as pool:
        done = list(pool.map(lambda s: _compile(NVCC, s, out_dir), sources.SOURCES))
    yield {c.source.file: c for c in done}


@no_nvcc
@pytest.mark.slow  # nvcc compiles every source for every declared arch
@pytest.mark.parametrize("src", sources.SOURCES, ids=lambda s: s.file)
def test_compiles_for_every_declared_arch(compiled: dict[str, Compiled],
                                          src: KernelSource) -> None:
    result = compiled[src.file]
    assert result.returncode == 0, result.log
    assert "warning" not in result.log.lower(), result.log
    assert {(fn, arch) for fn in src.functions for arch in ARCHS} <= set(result.stats)


@no_nvcc
def test_every_declared_arch_is_covered() -> None:
    missing = [a for a in sources.ARCHS if a not in ARCHS]
    if missing:
        pytest.skip(f"this nvcc ({NVCC}) cannot target {', '.join(missing)}; the compile "
                    f"tests above cover {', '.join(ARCHS) or 'nothing'}")
    assert {"sm_80", "sm_90", "sm_120"} <= set(ARCHS)


@no_nvcc
@pytest.mark.slow  # nvcc compiles every source for every declared arch
@pytest.mark.parametrize("src", sources.SOURCES, ids=lambda s: s.file)
def test_no_spills_and_no_stack(compiled: dict[str, Compiled], src: KernelSource) -> None:
    stats = compiled[src.file].stats
    for fn in src.functions:
        for arch in ARCHS:
            s = stats[(fn, arch)]
            assert (s.spill_stores, s.spill_loads, s.stack) == (0, 0, 0), (fn, arch, s)


@no_nvcc
@pytest.mark.slow  # nvcc compiles every source for every declared arch
def test_gemm_register_budgets(compiled: dict[str, Compiled]) -> None:
    """256-thread GEMM blocks: at most 128 registers keeps two blocks per SM resident."""
    for src in sources.GEMM_SOURCES:
        for (fn, arch), s in compiled[src.file].stats.items():
            assert s.registers <= 65536 // (2 * 256), (fn, arch, s)


@pytest.mark.skipif(NVCC is not None or nvrtc_reason() is not None,
                    reason="nvcc is present, so the ptxas tests cover the compile"
                    if NVCC is not None else f"CuPy's NVRTC is not importable: {nvrtc_reason()}")
@pytest.mark.parametrize("src", sources.SOURCES, ids=lambda s: s.file)
def test_compiles_with_nvrtc_without_nvcc(src: KernelSource) -> None:
    from cupy.cuda import compiler

    for arch in ("80", "90", "120"):
        ptx = compiler.compile_using_nvrtc(src.text(), options=src.options(), arch=arch)
        assert ptx


def test_a_compiler_exists_or_the_skip_says_why() -> None:
    if NVCC is None and nvrtc_reason() is not None:
        pytest.skip(f"no CUDA compiler at all: no nvcc, and CuPy's NVRTC is not importable "
                    f"({nvrtc_reason()})")
    assert NVCC is not None or nvrtc_reason() is None
