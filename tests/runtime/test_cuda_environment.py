"""Issue 30, point 6: the environment and the docs say what is true.

The environment a GPU timing is recorded under names the CUDA runtime loaded here (not
only the one CuPy was built against), NVRTC (which decides the machine code) and the
TF32 switches; the docs give occupancy per architecture and ROCm's support as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pytest_arbiter.extend.fingerprint import current_environment, forget_environment
from pytest_arbiter.runtime.cuda import sources
from tests.factories import ROOT
from tests.runtime.cuda_fakes import H100, FakeGpu

DOCS = ROOT / "docs" / "gpu.md"


@pytest.fixture
def fresh_environment() -> Iterator[None]:
    forget_environment()
    yield
    forget_environment()


@pytest.mark.usefixtures("fresh_environment")
def test_the_gpu_environment_names_runtime_nvrtc_and_tf32(
        cupy_as: Callable[[Any], None], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUPY_TF32", "1")
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    cupy_as(FakeGpu(H100, nvrtc=(12, 9)).cp)
    env = current_environment("nvidia")
    assert env["cuda_runtime"] == "13010"  # what CuPy was built against
    assert env["cuda_runtime_local"] == "13000"  # what is loaded here
    assert env["nvrtc"] == "12.9"
    assert env["driver"] == "13000"
    assert env["cupy_tf32"] == "1" and env["nvidia_tf32_override"] == "unset"


@pytest.mark.usefixtures("fresh_environment")
def test_a_tf32_switch_changes_the_environment(cupy_as: Callable[[Any], None],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cupy_as(FakeGpu(H100).cp)
    monkeypatch.delenv("CUPY_TF32", raising=False)
    before = current_environment("nvidia")
    forget_environment()
    monkeypatch.setenv("CUPY_TF32", "1")
    assert current_environment("nvidia") != before


def test_occupancy_is_stated_per_architecture() -> None:
    blocks = {arch: sources.mma_blocks_per_sm(arch) for arch in sources.ARCHS}
    assert blocks == {"sm_80": 2, "sm_86": 1, "sm_89": 1, "sm_90": 2, "sm_100": 2,
                      "sm_120": 1}
    text = DOCS.read_text(encoding="utf-8")
    row = "| tensor-core GEMM blocks per SM | " + " | ".join(
        str(blocks[a]) for a in sources.ARCHS) + " |"
    assert row in text
    assert "so two blocks fit per SM" not in text


def test_the_rocm_support_is_stated_as_it_is() -> None:
    text = " ".join(DOCS.read_text(encoding="utf-8").split())
    assert "gfx1030, gfx1100-gfx1102, gfx1200 and gfx1201" in text
    assert "not for gfx1151" in text
