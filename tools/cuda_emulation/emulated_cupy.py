"""A stand-in for CuPy that runs the bundled CUDA kernels on the CPU emulator (emulator.h).

Arrays are NumPy arrays. ``RawModule`` compiles the kernel source with the host C++
compiler and the emulator, one executable per kernel function; a launch writes each array
argument to a file, runs the executable with the grid, block and shared-memory size, and
reads the arrays back. The rest is what the emitted lane's code asks of CuPy: the device,
allocation (``empty`` is poisoned with 0xFF bytes, NaN in every float format, so an
output element the kernel never writes shows) and copies.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

EMULATOR = Path(__file__).with_name("emulator.h")
PTX_EMULATED = EMULATOR.with_name("ptx_emulated.cuh")
"""The CPU twin of the kernels' ``ptx_shim.cuh``, found through ``-I`` this folder."""
DEFAULT_DYNAMIC_SHARED = 48 * 1024
TSAN_EXIT = 66
TSAN_OPTIONS = f"halt_on_error=1 exitcode={TSAN_EXIT}"
TSAN_RACE = "WARNING: ThreadSanitizer: data race"
# the most dynamic shared memory one block may opt into, by compute capability (CUDA
# programming guide, "Technical Specifications per Compute Capability")
OPT_IN_SHARED = {(7, 5): 64 * 1024, (8, 0): 163 * 1024, (8, 6): 99 * 1024,
                 (8, 9): 99 * 1024, (9, 0): 227 * 1024, (10, 0): 227 * 1024,
                 (12, 0): 99 * 1024}


class EmulatedKernelError(RuntimeError):
    """The emulator refused or aborted a launch, or the kernel did not compile for it."""


def find_compiler() -> str:
    """A host C++ compiler the emulator can use: C++17 with ``_Float16`` (GCC 12 or newer
    on x86-64 Linux).

    Raises :class:`LookupError` saying why there is none.
    """
    tried = []
    for name in ("g++", "c++"):
        found = shutil.which(name)
        if found is None:
            tried.append(f"{name}: not on PATH")
            continue
        probe = subprocess.run([found, "-std=c++17", "-fsyntax-only", "-x", "c++", "-"],
                               input="#include <ucontext.h>\n_Float16 half = 1.0f;\n",
                               capture_output=True, text=True, timeout=60)
        if probe.returncode == 0:
            return found
        first = (probe.stderr.strip().splitlines() or ["failed"])[0]
        tried.append(f"{found}: no C++17 with _Float16 and ucontext.h ({first})")
    raise LookupError("; ".join(tried))


def thread_sanitizer_problem(compiler: str, directory: Path) -> str | None:
    """Why ``compiler`` cannot build and run a ThreadSanitizer fiber program here, or None."""
    source = directory / "tsan_probe.cpp"
    exe = directory / "tsan_probe"
    source.write_text("#include <sanitizer/tsan_interface.h>\n"
                      "int main() { void* f = __tsan_create_fiber(0); __tsan_destroy_fiber(f); }\n",
                      encoding="utf-8")
    built = subprocess.run([compiler, "-fsanitize=thread", "-o", str(exe), str(source)],
                           capture_output=True, text=True, timeout=120)
    if built.returncode != 0:
        return f"{compiler} -fsanitize=thread failed: {built.stderr.strip()[:300]}"
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    if ran.returncode != 0:
        return f"a ThreadSanitizer program does not run here: {ran.stderr.strip()[:300]}"
    return None


def launch_bound(code: str, function: str) -> str | None:
    """The ``__launch_bounds__`` maximum (an expression) written before ``function``."""
    found = re.search(
        rf"__launch_bounds__\(\s*([^,)]+?)\s*(?:,[^)]*)?\)\s*{re.escape(function)}\s*\(", code)
    return found[1] if found else None


@dataclass(frozen=True)
class Schedule:
    """How the emulator orders threads and completes ``cp.async`` copies.

    ``order``: ``forward``, ``reverse`` or ``shuffled:SEED`` (threads and blocks);
    ``copies``: ``lazy`` (at the ``wait_group`` that retires them, the latest the PTX
    allows) or ``eager`` (at issue, the earliest).
    """

    order: str = "forward"
    copies: str = "lazy"


@dataclass
class Builder:
    """Compiles kernel functions into emulator executables, once per source and options."""

    directory: Path
    compiler: str
    _built: dict[str, Path] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def build(self, code: str, options: Sequence[str], function: str, *,
              racecheck: bool = False) -> Path:
        """The emulator executable of ``function``; with ``racecheck``, built with
        ThreadSanitizer watching every plain memory access (several times slower)."""
        flags = []
        for option in options:
            if not option.startswith(("-std=", "-D")):
                raise EmulatedKernelError(f"option {option!r} has no host equivalent")
            flags.append(option)
        emulator = EMULATOR.read_text(encoding="utf-8") + PTX_EMULATED.read_text(
            encoding="utf-8")
        if racecheck:
            flags += ["-fsanitize=thread", "-DEMU_TSAN", "-g"]
        key = hashlib.sha256("\0".join([emulator, code, *flags, function]).encode()).hexdigest()
        with self._lock:
            found = self._built.get(key)
        if found is not None:
            return found
        source = self.directory / f"{function}-{key[:16]}.cpp"
        exe = source.with_suffix("")
        bound = launch_bound(code, function)
        source.write_text(
            f'#include "{EMULATOR}"\n#line 1 "{function} (emulated kernel source)"\n{code}\n'
            f"int main(int argc, char** argv) {{\n"
            + (f"    emu::g.launch_bound = ({bound});\n" if bound else "")
            + f'    return emu::launch_main(argc, argv, &{function}, "{function}");\n}}\n',
            encoding="utf-8")
        done = subprocess.run(
            [self.compiler, "-O2", "-DARBITER_HOST_EMULATION", f"-I{EMULATOR.parent}",
             *flags, "-o", str(exe),
             str(source)], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise EmulatedKernelError(f"{function} does not compile for the emulator:\n"
                                      f"{done.stderr[-4000:]}")
        with self._lock:
            self._built[key] = exe
        return exe


def _tsan_report(stderr: str) -> str:
    """The first race ThreadSanitizer printed: its summary and the two accesses."""
    lines = stderr.splitlines()
    summary = next((x for x in lines if x.startswith("SUMMARY: ThreadSanitizer")), "")
    accesses = [x.strip() for x in lines
                if x.lstrip().startswith(("Write of size", "Read of size", "Previous write",
                                          "Previous read"))]
    frames = [x.strip() for x in lines if "(emulated kernel source)" in x][:2]
    return "; ".join(["data race (ThreadSanitizer)", *accesses[:2], *frames, summary])


def _dims(value: int | Sequence[int]) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3 or min(dims) < 1:
        raise ValueError(f"a grid or block has 1 to 3 dimensions of at least 1, got {value!r}")
    return (*dims, *(1,) * (3 - len(dims)))  # type: ignore[return-value]


class EmulatedFunction:
    """One kernel function; calling it launches it on the emulator, like CuPy's."""

    def __init__(self, owner: EmulatedCupy, module: EmulatedModule, name: str) -> None:
        self.owner = owner
        self.module = module
        self.name = name
        self.max_dynamic_shared_size_bytes = 0

    def __call__(self, grid: int | Sequence[int], block: int | Sequence[int],
                 args: Sequence[Any], *, shared_mem: int = 0, stream: Any = None) -> None:
        gx, gy, gz = _dims(grid)
        bx, by, bz = _dims(block)
        limit = int(self.owner.props["sharedMemPerBlockOptin"])
        if shared_mem > limit:
            raise EmulatedKernelError(f"{self.name}: {shared_mem} bytes of dynamic shared "
                                      f"memory, the device allows {limit}")
        if shared_mem > DEFAULT_DYNAMIC_SHARED and shared_mem > self.max_dynamic_shared_size_bytes:
            raise EmulatedKernelError(
                f"{self.name}: {shared_mem} bytes of dynamic shared memory needs "
                f"max_dynamic_shared_size_bytes set first (it is "
                f"{self.max_dynamic_shared_size_bytes}); CUDA refuses the launch")
        exe = self.module.executable(self.name)
        schedule = self.owner.schedule
        with tempfile.TemporaryDirectory(prefix="arbiter-emu-") as tmp:
            argv = [str(exe), "--grid", str(gx), str(gy), str(gz), "--block", str(bx), str(by),
                    str(bz), "--smem", str(shared_mem), "--order", schedule.order,
                    "--copies", schedule.copies, "--"]
            buffers: list[tuple[np.ndarray, Path]] = []
            for index, arg in enumerate(args):
                if isinstance(arg, np.ndarray) and not isinstance(arg, DeviceArray):
                    raise TypeError(f"{self.name}: argument {index} is a host (NumPy) array; "
                                    f"a kernel takes device arrays")
                if isinstance(arg, DeviceArray):
                    for other, _ in buffers:
                        if np.shares_memory(arg, other):
                            raise EmulatedKernelError(
                                f"{self.name}: argument {index} overlaps an earlier one; the "
                                f"emulator gives each argument its own memory, so it refuses "
                                f"aliased arguments")
                    if not arg.flags.c_contiguous:
                        raise EmulatedKernelError(f"{self.name}: argument {index} is not "
                                                  f"C-contiguous; a kernel sees raw memory")
                    path = Path(tmp, f"arg{index}.bin")
                    path.write_bytes(arg.tobytes())
                    buffers.append((arg, path))
                    argv.append(f"p:{path}")
                elif isinstance(arg, np.int32):
                    argv.append(f"i:{int(arg)}")
                else:
                    raise TypeError(f"{self.name}: argument {index} is a {type(arg).__name__}; "
                                    f"the kernels take arrays and numpy.int32")
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "TSAN_OPTIONS": TSAN_OPTIONS})
            if done.returncode == TSAN_EXIT and TSAN_RACE in done.stderr:
                raise EmulatedKernelError(f"{self.name}: {_tsan_report(done.stderr)}")
            if done.returncode != 0:
                if done.returncode < 0:
                    why = f"killed by {signal.Signals(-done.returncode).name}"
                    if done.returncode == -signal.SIGSEGV:
                        why += (" (an access into the guard region around a buffer, or "
                                "other unmapped memory)")
                else:
                    why = done.stderr.strip() or f"exit status {done.returncode}"
                raise EmulatedKernelError(f"{self.name}: {why}")
            for array, path in buffers:
                array[...] = np.frombuffer(path.read_bytes(), dtype=array.dtype).reshape(
                    array.shape)
        self.owner.log.append(done.stderr.strip())


class EmulatedModule:
    """``cupy.RawModule``: the source and options, compiled per function on first use."""

    def __init__(self, owner: EmulatedCupy, code: str, options: Sequence[str] = ()) -> None:
        self.owner = owner
        self.code = code
        self.options = tuple(options)

    def executable(self, name: str) -> Path:
        return self.owner.builder.build(self.code, self.options, name,
                                        racecheck=self.owner.racecheck)

    def get_function(self, name: str) -> EmulatedFunction:
        if re.search(rf"\b{re.escape(name)}\s*\(", self.code) is None:
            raise EmulatedKernelError(f"no kernel named {name!r} in this module")
        self.executable(name)
        return EmulatedFunction(self.owner, self, name)


class EmulatedRuntime:
    is_hip = False

    def __init__(self, props: dict[str, Any]) -> None:
        self.props = props

    def getDeviceCount(self) -> int:
        return 1

    def getDevice(self) -> int:
        return 0

    def getDeviceProperties(self, index: int) -> dict[str, Any]:
        return dict(self.props)


class DeviceArray(np.ndarray):
    """An array on the emulated device: only these may be passed to a kernel."""


def _on_device(x: Any) -> DeviceArray:
    return np.array(x, copy=True).view(DeviceArray)


def _poisoned(shape: Any, dtype: Any) -> DeviceArray:
    out = np.empty(shape, dtype=dtype)
    out.view(np.uint8).fill(0xFF)
    return out.view(DeviceArray)


class EmulatedCupy:
    """The CuPy module as the GPU lanes use it, with kernels run by the emulator."""

    __version__ = "emulated"
    ndarray = DeviceArray

    def __init__(self, builder: Builder, *, major: int = 9, minor: int = 0,
                 schedule: Schedule | None = None, racecheck: bool = False) -> None:
        self.builder = builder
        self.schedule = schedule or Schedule()
        self.racecheck = racecheck
        self.props: dict[str, Any] = {
            "name": f"CPU emulation of sm_{major}{minor}", "major": major, "minor": minor,
            "sharedMemPerBlockOptin": OPT_IN_SHARED.get((major, minor), 48 * 1024),
            "l2CacheSize": 50 * 1024 * 1024}
        # every array is its own guarded allocation already, so there is no pool to switch off
        self.cuda = SimpleNamespace(runtime=EmulatedRuntime(self.props),
                                    set_allocator=lambda allocator=None: None)
        self.log: list[str] = []

    def RawModule(self, *, code: str, options: Sequence[str] = ()) -> EmulatedModule:
        return EmulatedModule(self, code, options)

    @staticmethod
    def asarray(x: Any) -> DeviceArray:
        return x if isinstance(x, DeviceArray) else _on_device(x)

    @staticmethod
    def ascontiguousarray(x: Any) -> DeviceArray:
        return x if isinstance(x, DeviceArray) and x.flags.c_contiguous else _on_device(x)

    @staticmethod
    def asnumpy(x: Any) -> np.ndarray:
        return np.array(x, copy=True).view(np.ndarray)

    @staticmethod
    def zeros(shape: Any, dtype: Any = np.float64) -> DeviceArray:
        return np.zeros(shape, dtype=dtype).view(DeviceArray)

    @staticmethod
    def empty(shape: Any, dtype: Any = np.float64) -> np.ndarray:
        return _poisoned(shape, dtype)

    @staticmethod
    def empty_like(x: Any) -> np.ndarray:
        return _poisoned(x.shape, x.dtype)
