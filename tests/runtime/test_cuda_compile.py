"""Host-free proof: every bundled .cu compiles for each declared NVIDIA arch, GEMMs spill-free.

The compile uses the text the runtime hands to CuPy's RawModule and the options CuPy
then hands the compiler (``KernelSource.text()`` / ``.nvrtc_options()``): with the
``nvcc`` on the machine (ptxas statistics), and with NVRTC itself through CuPy's bindings
wherever libnvrtc loads (no driver, no GPU needed; compiles only, no ptxas statistics).
"""

from __future__ import annotations

import importlib.util
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
    """Why CuPy's NVRTC bindings cannot compile here (no CuPy, no libnvrtc), or None.
    NVRTC needs no driver and no GPU."""
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
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


def nvrtc_compile(text: str, options: tuple[str, ...]) -> bytes:
    """A cubin from NVRTC through CuPy's bindings, without the driver (CuPy's own
    ``compile_using_nvrtc`` asks the current device for its architecture first)."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(text, "kern.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(prog, list(options))
        except nvrtc.NVRTCError as exc:
            raise AssertionError(f"{exc}\n{nvrtc.getProgramLog(prog)}") from exc
        return bytes(nvrtc.getCUBIN(prog))
    finally:
        nvrtc.destroyProgram(prog)


@pytest.mark.skipif(nvrtc_reason() is not None,
                    reason=f"CuPy's NVRTC cannot be loaded: {nvrtc_reason()}")
@pytest.mark.parametrize("src", sources.SOURCES, ids=lambda s: s.file)
def test_compiles_with_nvrtc_with_cupys_options(src: KernelSource) -> None:
    """NVRTC, with exactly the options CuPy's RawModule passes, for each declared arch
    this NVRTC can target, on a machine with no GPU and no driver."""
    from cupy_backends.cuda.libs import nvrtc

    version = nvrtc.getVersion()
    archs = [a for a in (80, 90, 100, 120) if a <= 90 or version >= (12, 8)]
    for arch in archs:
        assert nvrtc_compile(src.text(), src.nvrtc_options(arch))


def test_options_are_cupys() -> None:
    """CuPy 14 adds -ftz=true, the arch and --device-as-default-execution-space."""
    assert sources.SOFTMAX.nvrtc_options(120) == (
        "-std=c++17", "-ftz=true", "-arch=sm_120", "--device-as-default-execution-space")
    cmd = sources.SGEMM.nvcc_command("nvcc", ("sm_90",), "out")
    assert "-ftz=true" in cmd and cmd.index("-ftz=true") < cmd.index("-fatbin")


@pytest.mark.skipif(importlib.util.find_spec("cupy") is None,
                    reason="CuPy is not installed: the options are pinned by the test above")
def test_options_match_what_the_installed_cupy_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The options the installed CuPy's compile path (RawModule's callee) hands NVRTC,
    captured at the NVRTC program, with the driver-dependent parts stubbed."""
    from cupy.cuda import compiler

    captured: list[tuple[str, ...]] = []

    class Captured(Exception):
        pass

    class Program:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def compile(self, options: tuple[str, ...] = (), log_stream: object = None) -> None:
            captured.append(tuple(options))
            raise Captured

    class NoCache:
        def load(self, name: str) -> None:
            return None

    monkeypatch.setattr(compiler, "_NVRTCProgram", Program)
    monkeypatch.setattr(compiler, "_get_nvrtc_version", lambda: (13, 0))
    monkeypatch.setattr(compiler, "_preprocess", lambda *a, **k: "")
    monkeypatch.setattr(compiler, "_get_cupy_cache_key", lambda: "key")
    monkeypatch.setattr(compiler, "_get_arch_for_options_for_nvrtc",
                        lambda arch=None: (f"-arch=sm_{arch}", "cubin"))
    monkeypatch.setattr(compiler, "_kernel_cache_backend", NoCache())
    src = sources.MMA_GEMM
    with pytest.raises(Captured):
        compiler._compile_module_with_cache(src.text(), src.options(), arch="90",
                                            backend="nvrtc", jitify=False)
    assert captured == [src.nvrtc_options(90)]


def test_a_compiler_exists_or_the_skip_says_why() -> None:
    if NVCC is None and nvrtc_reason() is not None:
        pytest.skip(f"no CUDA compiler at all: no nvcc, and CuPy's NVRTC is not importable "
                    f"({nvrtc_reason()})")
    assert NVCC is not None or nvrtc_reason() is None
