"""The bundled CUDA C sources and the exact options they are compiled with.

The runtime hands :meth:`KernelSource.text` and :meth:`KernelSource.options` to CuPy's
``RawModule`` (NVRTC); the host-free tests hand the same text and options to ``nvcc``
for every declared architecture, so what is proven to compile is what runs.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

KERNEL_DIR = Path(__file__).with_name("kernels")

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
"""The NVIDIA architectures the emitted lane is declared for (sm_80 and newer)."""

MIN_COMPUTE_CAPABILITY = 80  # cp.async, ldmatrix, bf16 mma.sync and cvt.rn.bf16

MMA_TILE = (128, 128, 32)  # block tile (M, N, K) of the tensor-core GEMM
MMA_STAGES = 3
MMA_GROUP_M = 8  # block rows launched together (L2 reuse)
MMA_THREADS = 256
SGEMM_TILE = (128, 128, 8)
SGEMM_THREADS = 256


@dataclass(frozen=True)
class KernelSource:
    """One ``.cu`` file, its ``extern "C"`` entry points and its ``-D`` parameters."""

    file: str
    functions: tuple[str, ...]
    defines: tuple[tuple[str, int], ...] = field(default_factory=tuple)

    @property
    def path(self) -> Path:
        return KERNEL_DIR / self.file

    def text(self) -> str:
        """The source with the kernels' local headers (``ptx_shim.cuh``) inlined, so NVRTC
        needs no include path and its cache key covers the headers."""
        return _expand(self.path)

    def options(self) -> tuple[str, ...]:
        """The options the runtime hands to ``RawModule`` (CuPy adds its own to them:
        :meth:`nvrtc_options`)."""
        return ("-std=c++17", *(f"-D{name}={value}" for name, value in self.defines))

    def nvrtc_options(self, arch: int) -> tuple[str, ...]:
        """Exactly what CuPy 14's ``RawModule`` hands NVRTC for a cubin of ``sm_<arch>``:
        :meth:`options`, then ``-ftz=true`` (``_compile_with_cache_cuda``), the
        architecture and ``--device-as-default-execution-space``
        (``_compile_using_nvrtc``), in that order."""
        return (*self.options(), *CUPY_NVRTC_OPTIONS, f"-arch=sm_{arch}", CUPY_DEFAULT_DEVICE)

    def nvcc_command(self, nvcc: str, archs: tuple[str, ...], out: str) -> list[str]:
        """An nvcc call that compiles this source to a cubin per arch, with ptxas stats,
        with CuPy's code-generation options. ``--device-as-default-execution-space`` has
        no nvcc spelling; it only changes functions declared without an execution space,
        and nvcc refuses to call one of those from a kernel, so a source nvcc compiles
        gets the same device code (the NVRTC test compiles with the flag itself)."""
        gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
        return [nvcc, *self.options(), *CUPY_NVRTC_OPTIONS, *gencode, "-fatbin",
                "-Xptxas", "-v", "-o", out, str(self.path)]


CUPY_NVRTC_OPTIONS = ("-ftz=true",)
"""What CuPy 14 adds to every CUDA compile (``cupy/cuda/compiler.py``): subnormal float32
results flushed to zero. The F4 gate's budget allows for that flush."""
CUPY_DEFAULT_DEVICE = "--device-as-default-execution-space"


_LOCAL_INCLUDE = re.compile(r'^#include "([\w.]+)"[ \t]*$', re.MULTILINE)


@functools.cache
def _expand(path: Path) -> str:
    """``path``'s text with each ``#include "name"`` of a file beside it inlined (once)."""
    seen: set[str] = set()

    def inline(found: re.Match[str]) -> str:
        name = found.group(1)
        header = path.parent / name
        if not header.is_file():
            return found.group(0)  # left to the compiler's include path
        if name in seen:
            return ""
        seen.add(name)
        return _LOCAL_INCLUDE.sub(inline, header.read_text(encoding="utf-8"))

    return _LOCAL_INCLUDE.sub(inline, path.read_text(encoding="utf-8"))


SGEMM = KernelSource("sgemm.cu", ("tiled_sgemm",),
                     (("SGEMM_BM", SGEMM_TILE[0]), ("SGEMM_BN", SGEMM_TILE[1]),
                      ("SGEMM_BK", SGEMM_TILE[2])))
MMA_GEMM = KernelSource("mma_gemm.cu", ("mma_gemm_f16", "mma_gemm_bf16"),
                        (("GEMM_BM", MMA_TILE[0]), ("GEMM_BN", MMA_TILE[1]),
                         ("GEMM_BK", MMA_TILE[2]), ("GEMM_STAGES", MMA_STAGES),
                         ("GEMM_GROUP_M", MMA_GROUP_M)))
SOFTMAX = KernelSource("softmax.cu",
                       ("fused_softmax_f32", "fused_softmax_f16", "fused_softmax_bf16"))
SOURCES = (SGEMM, MMA_GEMM, SOFTMAX)
GEMM_SOURCES = (SGEMM, MMA_GEMM)


def mma_shared_bytes() -> int:
    """Dynamic shared memory of one tensor-core GEMM block (rows padded by 8 elements)."""
    bm, bn, bk = MMA_TILE
    return MMA_STAGES * (bm * (bk + 8) + bk * (bn + 8)) * 2


SHARED_MEMORY_PER_SM = {"sm_80": 164 << 10, "sm_86": 100 << 10, "sm_89": 100 << 10,
                        "sm_90": 228 << 10, "sm_100": 228 << 10, "sm_120": 100 << 10}
"""Shared memory an SM can give its blocks, per declared architecture (CUDA C++
Programming Guide, compute capabilities table); the driver reserves 1 KiB per block."""
RESERVED_SHARED_PER_BLOCK = 1 << 10
GEMM_BLOCKS_BY_REGISTERS = 2  # __launch_bounds__(256, 2): at most 128 registers a thread


def mma_blocks_per_sm(arch: str) -> int:
    """Resident tensor-core GEMM blocks per SM on ``arch``: two by registers, fewer
    where shared memory runs out (one on the 100 KiB of sm_86, sm_89 and sm_120)."""
    by_shared = SHARED_MEMORY_PER_SM[arch] // (mma_shared_bytes() + RESERVED_SHARED_PER_BLOCK)
    return min(GEMM_BLOCKS_BY_REGISTERS, by_shared)
