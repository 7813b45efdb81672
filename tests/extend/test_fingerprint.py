"""What a measurement was taken against: candidates' code fingerprints, the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_arbiter.core.candidates import Candidate, FunctionCandidate
from pytest_arbiter.extend.fingerprint import current_environment, fingerprint_of
from tests.factories import ROOT


def _candidate(source: str, name: str = "k", version: str | None = None) -> FunctionCandidate:
    scope: dict[str, Any] = {"np": np}
    exec(textwrap.dedent(source), scope)  # a kernel as a user's module would define it
    return FunctionCandidate(scope[name], name, "matmul", "cpu", 0, None, None,
                             version=version)


KERNEL = """
def k(a, b):
    '''Multiply.'''
    if a.dtype.itemsize == 2:
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    return np.matmul(a, b)
"""


def test_a_function_candidate_is_fingerprinted_by_its_code() -> None:
    base = fingerprint_of(_candidate(KERNEL))
    assert len(base) == 16 and int(base, 16) >= 0
    assert fingerprint_of(_candidate(KERNEL)) == base  # another object, the same code
    # documentation and layout are not the code
    assert fingerprint_of(_candidate(KERNEL.replace("'''Multiply.'''", "'''Product.'''"))) \
        == base
    assert fingerprint_of(_candidate("\n\n" + KERNEL)) == base
    # a changed constant, call, branch or nested function is
    for changed in (KERNEL.replace("== 2", "== 4"),
                    KERNEL.replace("np.matmul(a, b)", "np.dot(a, b)"),
                    KERNEL.replace("    return np.matmul(a, b)",
                                   "    f = lambda: np.matmul(a, b)\n    return f()"),
                    KERNEL.replace("np.float32", "np.float64")):
        assert fingerprint_of(_candidate(changed)) != base, changed
    # a declared version is part of it
    assert fingerprint_of(_candidate(KERNEL, version="2")) not in (base, fingerprint_of(
        _candidate(KERNEL, version="3")))


def test_nested_code_is_fingerprinted_too() -> None:
    outer = """
    def k(a, b):
        def inner(x):
            return x * 2
        return inner(a) @ b
    """
    assert fingerprint_of(_candidate(outer)) != fingerprint_of(
        _candidate(outer.replace("x * 2", "x * 3")))


def test_the_fingerprint_is_the_same_in_every_process() -> None:
    """String hashing is randomised per process: a frozenset constant's order too."""
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from tests.extend.test_fingerprint import _candidate
        from pytest_arbiter.extend.fingerprint import fingerprint_of
        print(fingerprint_of(_candidate('''
        def k(a, b):
            if a.dtype.name in {"float16", "bfloat16", "float32", "int8"}:
                return a @ b
            return b @ a
        ''')))
    """)
    found = {subprocess.run([sys.executable, "-c", code, str(ROOT)],
                            capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout
             for seed in (1, 2, 3)}
    assert len(found) == 1, found


class _Tiled(Candidate):
    def run(self, *inputs: Any) -> Any:
        return self.launch(*inputs)

    def launch(self, *inputs: Any) -> Any:
        return inputs[0] @ inputs[1]


def test_a_candidate_class_is_fingerprinted_by_its_methods_and_parts() -> None:
    base = fingerprint_of(_Tiled("t", "matmul", "cpu"))
    assert fingerprint_of(_Tiled("t2", "matmul", "cpu")) == base

    class Changed(_Tiled):
        def launch(self, *inputs: Any) -> Any:
            return inputs[1] @ inputs[0]

    class WithSource(_Tiled):
        options = ("-DTILE=64",)

        def fingerprint_parts(self) -> tuple[str, ...]:
            return ("kernel.cu", "__global__ void k() {}", *self.options)

    class OtherOptions(WithSource):
        options = ("-DTILE=128",)

    found = {fingerprint_of(c("x", "matmul", "cpu"))
             for c in (_Tiled, Changed, WithSource, OtherOptions)}
    assert len(found) == 4


def test_a_bundled_cuda_kernel_is_fingerprinted_by_its_source_and_options(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_arbiter.runtime.cuda import emitted, sources

    sgemm = emitted.TiledSgemm("tiled_sgemm", "matmul", "nvidia", 0, ("float32",))
    parts = sgemm.fingerprint_parts()
    assert parts[0] == "sgemm.cu" and "tiled_sgemm" in parts[1] and "-std=c++17" in parts
    before = fingerprint_of(sgemm)
    monkeypatch.setattr(emitted.TiledSgemm, "kernel_source", sources.KernelSource(
        "sgemm.cu", ("tiled_sgemm",), (("SGEMM_BM", 64), ("SGEMM_BN", 128), ("SGEMM_BK", 8))))
    assert fingerprint_of(emitted.TiledSgemm("tiled_sgemm", "matmul", "nvidia", 0,
                                             ("float32",))) != before
    kernels = {c.name: fingerprint_of(c) for c in emitted.candidates()}
    assert len(set(kernels.values())) == len(kernels)


def test_every_bundled_candidate_has_a_fingerprint(registry: Any) -> None:
    found = {c.name: fingerprint_of(c) for c in registry}
    assert all(len(fp) == 16 for fp in found.values())
    # two candidates of one class and code (cuBLAS and hipBLAS GEMM) run the same code
    assert found["cublas_matmul"] == found["hipblas_matmul"]
    assert found["blas_matmul"] != found["dot_matmul"]


def test_a_builtin_kernel_is_fingerprinted_by_its_name() -> None:
    first = FunctionCandidate(np.matmul, "m", "matmul", "cpu", 0, None, None)
    second = FunctionCandidate(np.dot, "d", "matmul", "cpu", 0, None, None)
    assert fingerprint_of(first) != fingerprint_of(second)


def test_the_cpu_environment_names_python_numpy_and_the_device_without_cupy() -> None:
    env = current_environment("cpu")
    assert env["numpy"] == np.__version__ and env["python"].count(".") == 2
    assert env["device_name"] and all(isinstance(v, str) for v in env.values())
    assert "cupy" not in env
    code = ("import json, sys; from pytest_arbiter.extend.fingerprint import current_environment; "
            "current_environment('cpu'); print(json.dumps('cupy' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) is False


def test_a_gpu_environment_without_cupy_still_names_the_host_side() -> None:
    env = current_environment("nvidia")
    assert env["numpy"] == np.__version__ and "python" in env


HELPED = """
def _tile(a, b):
    return np.matmul(a, b)

def k(a, b):
    return _tile(a, b)
"""


def test_an_edit_to_a_helper_the_kernel_calls_changes_its_fingerprint() -> None:
    """The corpus vouches for a kernel's code (production skips the gate for it): a
    shared helper edited after tuning must make the entry stale, not vouched."""
    base = fingerprint_of(_candidate(HELPED))
    assert fingerprint_of(_candidate(HELPED)) == base
    edited = HELPED.replace("return np.matmul(a, b)", "return np.zeros((a.shape[0], b.shape[1]))")
    assert fingerprint_of(_candidate(edited)) != base
    # reached through a closure too (a kernel built by a factory)
    factory = """
def make(helper):
    def k(a, b):
        return helper(a, b)
    return k

def _one(a, b):
    return np.matmul(a, b)

def _two(a, b):
    return np.dot(a, b)

k = make(_one)
"""
    first = fingerprint_of(_candidate(factory))
    assert fingerprint_of(_candidate(factory.replace("make(_one)", "make(_two)"))) != first
    # a helper calling itself, or two calling each other, ends
    recursive = """
def _a(x, n):
    return x if n == 0 else _b(x, n - 1)

def _b(x, n):
    return _a(x, n)

def k(a, b):
    return _a(np.matmul(a, b), 3)
"""
    assert len(fingerprint_of(_candidate(recursive))) == 16


@pytest.mark.parametrize("wrap", ["functools.lru_cache", "numba.njit"])
def test_an_edit_to_a_compiled_or_cached_helper_changes_its_kernels_fingerprint(
        wrap: str) -> None:
    """A helper the kernel calls through a wrapper that is not a Python function (a
    ``functools.lru_cache``, numba's ``@njit`` dispatcher) is hashed as the function it
    was made of: editing its body makes the corpus entry stale, so production never runs
    the edited kernel ungated on the old entry's word. So is a compiled kernel's own
    helper."""
    module = wrap.split(".")[0]
    pytest.importorskip(module)
    source = f"""
import {module}

@{wrap}
def _rows(x):
    return x + 1.0

def k(a, b):
    return _rows(np.matmul(a, b))
"""
    base = fingerprint_of(_candidate(source))
    assert fingerprint_of(_candidate(source)) == base
    assert fingerprint_of(_candidate(source.replace("x + 1.0", "x * 0.0"))) != base
    compiled = source.replace("def k(a, b):", f"@{wrap}\ndef k(a, b):")
    first = fingerprint_of(_candidate(compiled))
    assert fingerprint_of(_candidate(compiled.replace("x + 1.0", "x * 0.0"))) != first
    if module == "numba":  # its compiler options are part of what runs
        fast = source.replace("@numba.njit\ndef _rows", "@numba.njit(fastmath=True)\ndef _rows")
        assert fast != source and fingerprint_of(_candidate(fast)) != base


def test_a_helper_in_another_of_the_users_modules_is_part_of_the_fingerprint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``helpers.impl`` called through a module the kernel imports (not a package of its
    own, not an installed library): editing it changes the kernel's fingerprint."""
    import importlib
    import sys

    (tmp_path / "qa_helpers.py").write_text("def impl(x):\n    return x + 1\n")
    (tmp_path / "qa_kernels.py").write_text(
        "import numpy as np\nimport qa_helpers\n\n"
        "def inc(x):\n    return qa_helpers.impl(np.asarray(x))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # no bytecode cache: an edit of the same size within a second must be read again
    monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def fingerprint() -> str:
        for name in ("qa_helpers", "qa_kernels"):
            sys.modules.pop(name, None)
        kernels = importlib.import_module("qa_kernels")
        return fingerprint_of(FunctionCandidate(kernels.inc, "inc", "softmax", "cpu", 0,
                                                None, None))

    before = fingerprint()
    assert fingerprint() == before
    (tmp_path / "qa_helpers.py").write_text("def impl(x):\n    return x * 0\n")
    assert fingerprint() != before


def test_a_lazy_module_or_a_partials_arguments_never_break_or_blur_the_fingerprint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import functools
    import importlib
    import sys

    (tmp_path / "qa_lazy.py").write_text(
        "def __getattr__(name):\n    raise ImportError('needs an optional dependency')\n")
    (tmp_path / "qa_lazy_kernels.py").write_text(
        "import qa_lazy\n\ndef k(a, b):\n    return qa_lazy.tile(a, b)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    kernels = importlib.import_module("qa_lazy_kernels")
    try:
        lazy = FunctionCandidate(kernels.k, "k", "matmul", "cpu", 0, None, None)
        assert len(fingerprint_of(lazy)) == 16  # no ImportError into a dispatch
    finally:
        for name in ("qa_lazy", "qa_lazy_kernels"):
            sys.modules.pop(name, None)

    def scaled(a: np.ndarray, b: np.ndarray, scale: float = 1.0) -> np.ndarray:
        return np.matmul(a, b) * scale

    def as_candidate(fn: Any) -> FunctionCandidate:
        return FunctionCandidate(fn, "k", "matmul", "cpu", 0, None, None)

    one = fingerprint_of(as_candidate(functools.partial(scaled, scale=1.0)))
    assert fingerprint_of(as_candidate(functools.partial(scaled, scale=1.0))) == one
    assert fingerprint_of(as_candidate(functools.partial(scaled, scale=2.0))) != one


def test_a_name_instead_of_a_candidate_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"takes a candidate .*REGISTRY\.get\(name\).*'lse'"):
        fingerprint_of("lse")  # type: ignore[arg-type]


def test_an_edit_to_a_decorator_classs_call_changes_the_fingerprint() -> None:
    """A helper wrapped by a decorator class of the user's (``update_wrapper(self, fn)``):
    both the function it wraps and the class's own ``__call__`` are hashed."""
    source = """
import functools

class Doubled:
    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self.fn = fn

    def __call__(self, x):
        return self.fn(x) * 2

@Doubled
def _rows(x):
    return x + 1.0

def k(a, b):
    return _rows(np.matmul(a, b))
"""
    base = fingerprint_of(_candidate(source))
    assert fingerprint_of(_candidate(source.replace("x + 1.0", "x - 1.0"))) != base
    assert fingerprint_of(_candidate(source.replace(") * 2", ") * 3"))) != base


def _module_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str,
                   **modules: str) -> str:
    """The fingerprint of ``k`` in a fresh import of module ``qa_knobs`` (and of the
    other ``modules`` it imports) written from the sources given."""
    import importlib

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    for name, text in {"qa_knobs": source, **modules}.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
        sys.modules.pop(name, None)
    kernels = importlib.import_module("qa_knobs")
    return fingerprint_of(FunctionCandidate(kernels.k, "k", "softmax", "cpu", 0, None, None))


KNOB = """
import numpy as np
PASSES = 1
def k(x):
    for _ in range(PASSES):
        s = np.exp(x).sum(axis=-1)
    return s
"""


def test_a_tuning_knob_the_kernel_reads_is_part_of_its_fingerprint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``PASSES = 1`` edited to ``PASSES = 6`` makes the kernel 6x slower: the corpus
    entry must go stale, as for an edit of the kernel's body; so does a knob in another
    module of the user's (``cfg.PASSES``)."""
    base = _module_kernel(tmp_path, monkeypatch, KNOB)
    assert _module_kernel(tmp_path, monkeypatch, KNOB) == base
    assert _module_kernel(tmp_path, monkeypatch, KNOB.replace("= 1", "= 6")) != base
    tiles = KNOB.replace("PASSES = 1", "PASSES = 1\nTILE = (32, 32)")
    assert _module_kernel(tmp_path, monkeypatch, tiles) == base  # not read by k
    other = KNOB.replace("PASSES = 1", "import qa_cfg").replace("range(PASSES)",
                                                                "range(qa_cfg.PASSES)")
    first = _module_kernel(tmp_path, monkeypatch, other, qa_cfg="PASSES = 1\n")
    assert _module_kernel(tmp_path, monkeypatch, other, qa_cfg="PASSES = 1\n") == first
    assert _module_kernel(tmp_path, monkeypatch, other, qa_cfg="PASSES = 6\n") != first


def test_a_knob_computed_on_the_machine_is_not_part_of_the_fingerprint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``PASSES`` read from the environment (a thread count, a detected feature) differs
    between the runners of one fleet, not between versions of the code: the same code
    fingerprints the same everywhere."""
    computed = KNOB.replace("PASSES = 1", "import os\nPASSES = int(os.environ['QA_PASSES'])")
    monkeypatch.setenv("QA_PASSES", "1")
    one = _module_kernel(tmp_path, monkeypatch, computed)
    monkeypatch.setenv("QA_PASSES", "8")
    assert _module_kernel(tmp_path, monkeypatch, computed) == one


def test_a_knob_in_a_module_pytest_loaded_is_read_from_its_source(tmp_path: Path) -> None:
    """pytest's loader of test modules (assertion rewriting) has no ``get_code``: the
    knobs are read from the module's source file; every literal a name is set to is
    part of it, and a name set by a computation anywhere is no knob."""
    from pytest_arbiter.extend import literals

    path = tmp_path / "test_knobs.py"
    path.write_text("PASSES = 6\nNAME = 'x'\nTHREADS = len('abc')\nPASSES = 7\n"
                    "THREADS = 2\n")
    found = literals.module_knobs("test_knobs", object(), str(path))
    assert dict(found.literals) == {"PASSES": (6, 7), "NAME": ("x",)}


KNOB_FORMS = {
    "chained": ("X = PASSES = 1\n", "X = PASSES = 6\n"),
    "unpacked": ("PASSES, OTHER = 1, 2\n", "PASSES, OTHER = 6, 2\n"),
    "branch": ("import os\nif os.name:\n    PASSES = 1\nelse:\n    PASSES = 2\n",
               "import os\nif os.name:\n    PASSES = 6\nelse:\n    PASSES = 2\n"),
    "past 256 names": ("".join(f"N{i} = {i}\n" for i in range(300)) + "PASSES = 1\n",
                       "".join(f"N{i} = {i}\n" for i in range(300)) + "PASSES = 6\n"),
}


@pytest.mark.parametrize("form", list(KNOB_FORMS))
def test_every_form_of_a_literal_knob_is_part_of_the_fingerprint(
        form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chained or unpacked assignment, a branch of an ``if`` (either one edited),
    and a knob past the first 256 names (its store behind an ``EXTENDED_ARG``)."""
    before, after = KNOB_FORMS[form]
    source = KNOB.replace("PASSES = 1\n", "{knob}")
    base = _module_kernel(tmp_path, monkeypatch, source.replace("{knob}", before))
    assert _module_kernel(tmp_path, monkeypatch, source.replace("{knob}", before)) == base
    assert _module_kernel(tmp_path, monkeypatch, source.replace("{knob}", after)) != base


def test_a_knob_imported_from_another_module_of_the_users_is_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    imported = KNOB.replace("PASSES = 1", "from qa_cfg import PASSES")
    first = _module_kernel(tmp_path, monkeypatch, imported, qa_cfg="PASSES = 1\n")
    assert _module_kernel(tmp_path, monkeypatch, imported, qa_cfg="PASSES = 1\n") == first
    assert _module_kernel(tmp_path, monkeypatch, imported, qa_cfg="PASSES = 6\n") != first


def test_a_knob_set_at_run_time_is_hashed_by_its_code_s_literal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``config.TILE = 64`` in the code, set to a detected 128 at run time on some
    machines only: the fingerprint hashes the code's literal, the same on every runner
    (a live value would make the fleet's entries look changed on the others)."""
    import importlib

    config = "TILE = 64\n"
    kernel = KNOB.replace("PASSES = 1", "import qa_tiles").replace("range(PASSES)",
                                                                   "range(qa_tiles.TILE)")
    base = _module_kernel(tmp_path, monkeypatch, kernel, qa_tiles=config)
    importlib.import_module("qa_tiles").TILE = 128  # a machine's detected value
    sys.modules.pop("qa_knobs", None)
    kernels = importlib.import_module("qa_knobs")
    again = fingerprint_of(FunctionCandidate(kernels.k, "k", "softmax", "cpu", 0, None, None))
    assert again == base


def test_a_set_in_a_partial_fingerprints_the_same_in_every_process() -> None:
    """String hashing is randomised per process; a set's order follows it."""
    code = textwrap.dedent("""
        import functools, sys
        sys.path.insert(0, sys.argv[1])
        from pytest_arbiter.core.candidates import FunctionCandidate
        from pytest_arbiter.extend.fingerprint import fingerprint_of
        def check(x, allowed):
            return x in allowed
        k = functools.partial(check, allowed={"float32", "float64", "bfloat16", "int8"})
        print(fingerprint_of(FunctionCandidate(k, "k", "softmax", "cpu", 0, None, None)))
    """)
    seen = {subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True,
                           text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed}
                           ).stdout for seed in ("0", "1", "2", "3")}
    assert len(seen) == 1, seen


def test_an_op_s_package_defaults_are_hashed_by_name() -> None:
    """A user op without ``validate`` or ``budget`` gets the package's: their names
    are its definition, not their code (an upgrade of pytest-arbiter is no new op)."""
    from pytest_arbiter.core.ops import make_op
    from pytest_arbiter.extend import fingerprint

    op = make_op("qa_defaults", lambda x: x)
    seen: list[str] = []
    real = fingerprint._hash_callable
    try:
        fingerprint._hash_callable = lambda digest, fn, *rest: seen.append(  # type: ignore[assignment]
            getattr(fn, "__module__", ""))
        fingerprint.op_fingerprint(op)
    finally:
        fingerprint._hash_callable = real
    assert seen and not any(m.startswith("pytest_arbiter") for m in seen), seen


# -- the installed libraries a kernel calls ---------------------------------------------


def _installed_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       init: str, dist_version: str | None = None) -> Any:
    """A fake installed library ``qa_fastlib`` (its folder counted as site-packages), and
    a fingerprint function for a kernel of the user's that calls it."""
    import importlib
    import sys

    from pytest_arbiter.extend import fingerprint as fp_module, libraries

    site = tmp_path / "site"
    (site / "qa_fastlib").mkdir(parents=True, exist_ok=True)
    (site / "qa_fastlib" / "__init__.py").write_text(init)
    for old in site.glob("qa_fastlib-*.dist-info"):
        for file in old.iterdir():
            file.unlink()
        old.rmdir()
    if dist_version is not None:
        info = site / f"qa_fastlib-{dist_version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: qa_fastlib\nVersion: {dist_version}\n")
        (info / "top_level.txt").write_text("qa_fastlib\n")
    user = tmp_path / "user"
    user.mkdir(exist_ok=True)
    (user / "qa_lse.py").write_text(
        "import qa_fastlib\n\ndef lse(x):\n    return qa_fastlib.lse(x)\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(user))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(fp_module, "_library_paths", lambda: (os.path.join(str(site), ""),))
    for name in ("qa_fastlib", "qa_lse"):
        sys.modules.pop(name, None)
    importlib.invalidate_caches()
    libraries.forget()
    kernel = importlib.import_module("qa_lse").lse
    return fingerprint_of(FunctionCandidate(kernel, "lse", "softmax", "cpu", 0, None, None))


def test_upgrading_a_library_the_kernel_calls_changes_its_fingerprint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed library's code is not hashed, but its version is: an upgrade (10x
    slower, or wrong) makes the entry stale, so the kernel is gated and timed again."""
    code = "def lse(x):\n    return x\n"
    v1 = _installed_library(tmp_path, monkeypatch, code, dist_version="1.0")
    assert _installed_library(tmp_path, monkeypatch, code, dist_version="1.0") == v1
    assert _installed_library(tmp_path, monkeypatch, code, dist_version="2.0") != v1
    # no distribution metadata: the package's __version__, else its file's bytes
    bare = _installed_library(tmp_path, monkeypatch, code)
    assert _installed_library(tmp_path, monkeypatch, code + "# v3\n") != bare
    versioned = _installed_library(tmp_path, monkeypatch, '__version__ = "3"\n' + code)
    assert _installed_library(tmp_path, monkeypatch,
                              '__version__ = "3"\n' + code + "# same\n") == versioned


def test_the_environments_libraries_and_the_standard_library_are_not_versioned() -> None:
    """NumPy's version is the environment's (an upgrade re-times, keeps the ranking);
    the standard library's is the Python version's; a builtin names no library."""
    import math

    from pytest_arbiter.extend.libraries import library_versions

    assert library_versions([np, np.sum, math, math.sqrt, len, 3, "x"], "qa",
                            lambda module: False) == []
    hypothesis = pytest.importorskip("hypothesis")
    (found,) = library_versions([hypothesis.given], "qa", lambda module: False)
    assert found == f"hypothesis {hypothesis.__version__}"


def test_a_c_function_and_a_compiled_kernel_name_their_library() -> None:
    """``from msgspec.json import encode`` (a C function) is msgspec's, whatever its
    type; an ``@njit`` kernel is numba's: its own fingerprint holds numba's version."""
    from pytest_arbiter.extend.libraries import library_versions

    msgspec = pytest.importorskip("msgspec")
    assert library_versions([msgspec.json.encode], "qa", lambda module: False) == [
        f"msgspec {msgspec.__version__}"]
    numba = pytest.importorskip("numba")
    dispatcher = numba.njit(lambda x: x)
    assert library_versions([dispatcher], "tests", lambda module: False) == [
        f"numba {numba.__version__}"]


def test_a_package_of_several_distributions_is_versioned_by_all_of_them_sorted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A namespace package (``nvidia``, ``google``) installed by several distributions:
    every one of them, in sorted order, never the directory listing's first; one with
    no distribution and no file is "unknown", whatever the working folder holds."""
    import importlib
    import sys

    from pytest_arbiter.extend import libraries

    for dist, version in (("qa_ns_beta", "1.0"), ("qa_ns_alpha", "2.0")):
        info = tmp_path / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\n"
                                       f"Version: {version}\n")
        (info / "top_level.txt").write_text("qa_ns\n")
    (tmp_path / "qa_ns" / "one").mkdir(parents=True)
    (tmp_path / "qa_ns" / "one" / "__init__.py").write_text("")
    (tmp_path / "qa_bare" / "one").mkdir(parents=True)
    (tmp_path / "qa_bare" / "one" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "None").write_text("not a package")
    importlib.invalidate_caches()
    libraries.forget()
    try:
        modules = [importlib.import_module(m) for m in ("qa_ns", "qa_bare")]
        found = libraries.library_versions(modules, "qa", lambda module: False)
    finally:
        for name in ("qa_ns", "qa_ns.one", "qa_bare", "qa_bare.one"):
            sys.modules.pop(name, None)
        libraries.forget()
    assert found == ["qa_bare unknown", "qa_ns qa_ns_alpha==2.0, qa_ns_beta==1.0"]
