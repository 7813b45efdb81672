"""Every dispatch of the process goes through the run's gated arbiter: a kernel library
calling ``pytest_arbiter.dispatch`` from plain tests, outside pytest, under xdist.

Small real projects run through pytester (in-process); the production path runs in a
real subprocess with ``PYTEST_ARBITER_CACHE`` set and unset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from pytest_arbiter import Arbiter
from pytest_arbiter.core.candidates import REGISTRY, CandidateRegistry
from pytest_arbiter.store import artifacts

pytest_plugins = ["pytester"]

KERNLIB = '''
import numpy as np
import pytest_arbiter

pytest_arbiter.op("kl_scale", reference=lambda x: x.astype(np.float64) * 2.0)


@pytest_arbiter.candidate("kl_scale", target="cpu", name="kl_vector8")
def vector8(x):
    if x.shape[-1] % 8:
        raise pytest_arbiter.Decline("needs a multiple of 8 elements")
    return x * 2


def scale(x):
    return pytest_arbiter.dispatch("kl_scale", x)
'''

LIBRARY_TESTS = '''
import numpy as np
import kernlib


def test_aligned():
    assert (kernlib.scale(np.ones(16, np.float32)) == 2).all()


def test_ragged():
    out = kernlib.scale(np.ones(12, np.float32))
    assert out.dtype == np.float32 and (out == 2).all()
'''


pytestmark = pytest.mark.usefixtures("clean_registry")


def _histogram(path: Path) -> dict[tuple[str, ...], int]:
    data = json.loads(path.read_text())
    return {(e["target"], e["op"], e["selected"], e["outcome"]): e["count"]
            for e in data["entries"]}


def _properties(path: Path) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        out[case.get("name", "")] = props
    return out


def test_a_library_decline_from_a_plain_test_is_counted_gated_and_named(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(kernlib=KERNLIB, test_lib=LIBRARY_TESTS)
    result = pytester.runpytest("--arbiter-histogram=h.json", "--junitxml=j.xml", "-p",
                                "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*new degraded: target=cpu op=kl_scale candidate=kl_vector8 (1 dispatch)*",
        "*reason: needs a multiple of 8 elements*",
        "*tests: test_lib.py::test_ragged*",
        "*degrade gate FAILED*",
    ])
    assert _histogram(pytester.path / "h.json") == {
        ("cpu", "kl_scale", "kl_vector8", "won"): 1,
        ("cpu", "kl_scale", "kl_vector8", "degraded"): 1}
    props = _properties(pytester.path / "j.xml")
    assert props["test_ragged"] == {
        "arbiter:cpu/kl_scale/kl_vector8/degraded": "1",
        "arbiter-reason:cpu/kl_scale/kl_vector8/degraded": "needs a multiple of 8 elements",
        "arbiter-test": "test_lib.py::test_ragged"}
    assert props["test_aligned"] == {"arbiter:cpu/kl_scale/kl_vector8/won": "1"}


def test_the_baseline_accepts_a_known_library_degrade(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(kernlib=KERNLIB, test_lib=LIBRARY_TESTS)
    wrote = pytester.runpytest("--arbiter-write-baseline=base.json")
    assert wrote.ret == pytest.ExitCode.OK
    gated = pytester.runpytest("--arbiter-baseline=base.json")
    assert gated.ret == pytest.ExitCode.OK
    gated.stdout.fnmatch_lines(["*degrade gate passed*"])


BROKEN_CONFTEST = '''
import numpy as np
import pytest_arbiter

pytest_arbiter.op("kl_add1", reference=lambda x: x.astype(np.float64) + 1.0)


@pytest_arbiter.candidate("kl_add1", target="cpu", name="kl_zeros", tier=5)
def zeros(x):
    return np.zeros_like(x)


@pytest_arbiter.candidate("kl_add1", target="cpu", name="kl_inplace", tier=4)
def inplace(x):
    x += 1
    return x


@pytest_arbiter.candidate("kl_add1", target="cpu", name="kl_right", tier=0)
def right(x):
    return x + 1
'''

BROKEN_TESTS = '''
import numpy as np
import pytest
import pytest_arbiter


@pytest.mark.parametrize("i", range(12))
def test_add1(i):
    x = np.arange(8, dtype=np.float32) * i
    keep = x.copy()
    out = pytest_arbiter.dispatch("kl_add1", x)
    np.testing.assert_array_equal(x, keep)
    np.testing.assert_array_equal(out, keep + 1)
'''


@pytest.mark.parametrize("tune", [False, True])
def test_a_plain_run_never_runs_a_wrong_top_tier_kernel(pytester: pytest.Pytester,
                                                         tune: bool) -> None:
    pytester.makeconftest(BROKEN_CONFTEST)
    pytester.makepyfile(test_add=BROKEN_TESTS)
    args = ["--arbiter-histogram=h.json", *(["--arbiter-tune"] if tune else [])]
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=12)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # static: every dispatch reaches them; tune: the dispatch that measured did
    reached = "1 dispatch" if tune else "12 dispatches"
    result.stdout.fnmatch_lines([
        f"*new rejected: target=cpu op=kl_add1 candidate=kl_inplace ({reached})*",
        "*reason: failed the F4 gate: the kernel modified its inputs*",
        f"*new rejected: target=cpu op=kl_add1 candidate=kl_zeros ({reached})*",
        "*reason: failed the F4 gate: output is all zeros*",
    ])
    counts = _histogram(pytester.path / "h.json")
    assert counts[("cpu", "kl_add1", "kl_right", "won")] == 12
    assert not any(k[2] != "kl_right" and k[3] == "won" for k in counts)


DECLINE_ORDER_CONFTEST = '''
import numpy as np
import pytest_arbiter

# an op of its own, so the bundled matmul kernels (as fast as kl_rowmajor) cannot win the
# key: kl_rowmajor must be the cached winner for its decline on a cache hit to be tested
pytest_arbiter.op("kl_mm", reference=lambda a, b: np.matmul(a, b, dtype=np.float64))


@pytest_arbiter.candidate("kl_mm", target="cpu", name="kl_rowmajor", tier=9)
def rowmajor(a, b):
    if not a.flags.c_contiguous:
        raise pytest_arbiter.Decline("needs a row-major A")
    return np.matmul(a, b)


@pytest_arbiter.candidate("kl_mm", target="cpu", name="kl_rowwise", tier=1)
def rowwise(a, b):
    return np.stack([row @ b for row in a])
'''

ORDER_TEST = '''
import numpy as np
import pytest_arbiter


def test_order():
    a = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32)
    for x in {order}:
        np.testing.assert_allclose(pytest_arbiter.dispatch("kl_mm", x, b), a @ b, rtol=1e-4)
'''


@pytest.mark.parametrize("order", ["(a, np.asfortranarray(a))", "(np.asfortranarray(a), a)"])
def test_a_decline_on_a_cache_hit_runs_the_runner_up_in_either_order(
        pytester: pytest.Pytester, order: str) -> None:
    pytester.makeconftest(DECLINE_ORDER_CONFTEST)
    pytester.makepyfile(test_order=ORDER_TEST.format(order=order))
    result = pytester.runpytest("--arbiter-tune", "--arbiter-histogram=h.json",
                                "--arbiter-cache=c.json")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    counts = _histogram(pytester.path / "h.json")
    # the row-major A ran kl_rowmajor, the column-major one the runner-up: measured on
    # the row-major A first, kl_rowmajor's Decline on the cache hit hands the other on;
    # measured on the column-major A first, kl_rowmajor declined it and is tried again
    # (and wins) on the row-major A
    assert counts == {("cpu", "kl_mm", "kl_rowmajor", "won"): 1,
                      ("cpu", "kl_mm", "kl_rowwise", "won"): 1}, counts
    (entry,) = json.loads((pytester.path / "c.json").read_text())["entries"]
    assert [r["name"] for r in entry["ranking"]] == ["kl_rowmajor", "kl_rowwise"]


def test_a_kernel_that_declined_the_only_inputs_tuned_is_measured_only_by_a_later_tune(
        pytester: pytest.Pytester) -> None:
    """A user op's kernel that declined the inputs the key was tuned on is not timed; a
    plain or strict run does not count the key as stale for it, and the next tuning run
    with inputs it takes measures it."""
    pytester.makeconftest(DECLINE_ORDER_CONFTEST)
    pytester.makepyfile(test_order=ORDER_TEST.format(order="(np.asfortranarray(a),)"))
    tune = pytester.runpytest("--arbiter-tune", "--arbiter-cache=c.json")
    assert tune.ret == pytest.ExitCode.OK, tune.stdout.str()
    (entry,) = json.loads((pytester.path / "c.json").read_text())["entries"]
    assert [r["name"] for r in entry["ranking"]] == ["kl_rowwise"]
    for mode in ([], ["--arbiter-strict"]):
        plain = pytester.runpytest("--arbiter-cache=c.json", "--arbiter-histogram=h.json",
                                   *mode)
        assert plain.ret == pytest.ExitCode.OK, plain.stdout.str()
        assert "never measured" not in plain.stdout.str()
        assert _histogram(pytester.path / "h.json") == {
            ("cpu", "kl_mm", "kl_rowwise", "won"): 1}
    # the same column-major inputs again: declined again, and the file is left alone
    before = (pytester.path / "c.json").read_bytes()
    again = pytester.runpytest("--arbiter-tune", "--arbiter-cache=c.json")
    assert again.ret == pytest.ExitCode.OK, again.stdout.str()
    assert (pytester.path / "c.json").read_bytes() == before
    pytester.makepyfile(test_order=ORDER_TEST.format(order="(a,)"))
    later = pytester.runpytest("--arbiter-tune", "--arbiter-cache=c.json",
                               "--arbiter-histogram=h.json")
    assert later.ret == pytest.ExitCode.OK, later.stdout.str()
    assert _histogram(pytester.path / "h.json") == {("cpu", "kl_mm", "kl_rowmajor", "won"): 1}
    (entry,) = json.loads((pytester.path / "c.json").read_text())["entries"]
    assert [r["name"] for r in entry["ranking"]] == ["kl_rowmajor", "kl_rowwise"]


RAISING_CONFTEST = '''
import numpy as np
import pytest_arbiter

pytest_arbiter.op("kl_neg", reference=lambda x: -x)


@pytest_arbiter.candidate("kl_neg", target="cpu", name="kl_workspace", tier=3)
def workspace(x):
    raise MemoryError("workspace too small")


def bad_accepts(x):
    raise KeyError("no stride table")


@pytest_arbiter.candidate("kl_neg", target="cpu", name="kl_badaccepts", tier=2,
                          accepts=bad_accepts)
def badaccepts(x):
    return -x


@pytest_arbiter.candidate("kl_neg", target="cpu", name="kl_plain", tier=0)
def plain(x):
    return np.negative(x)
'''


def test_a_raising_kernel_is_an_error_with_its_message_and_the_caller_never_sees_it(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest(RAISING_CONFTEST)
    pytester.makepyfile(test_neg='''
import numpy as np
import pytest_arbiter


def test_neg():
    x = np.arange(4.0)
    assert (pytest_arbiter.dispatch("kl_neg", x) == -x).all()
''')
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*new error: target=cpu op=kl_neg candidate=kl_badaccepts (1 dispatch)*",
        "*reason: accepts() raised KeyError: 'no stride table'*",
        "*new error: target=cpu op=kl_neg candidate=kl_workspace (1 dispatch)*",
        "*reason: *MemoryError: workspace too small*",
        "*tests: test_neg.py::test_neg*",
    ])


@pytest.mark.parametrize(("source", "message"), [
    ('@pytest_arbiter.candidate("matmul", target="nvida")\ndef k(a, b):\n    return a @ b\n',
     "*unknown target 'nvida'*amd*cpu*nvidia*"),
    ('@pytest_arbiter.candidate("matmul", target="cpu", name="blas_matmul")\n'
     'def k(a, b):\n    return a @ b\n', "*blas_matmul*already registered*"),
])
def test_registration_mistakes_stop_the_run_with_the_reason(
        pytester: pytest.Pytester, source: str, message: str) -> None:
    pytester.makeconftest("import pytest_arbiter\n\n" + source)
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret != pytest.ExitCode.OK
    pytest.LineMatcher(result.outlines + result.errlines).fnmatch_lines([message])


def test_a_float64_reference_op_serves_a_float32_kernel(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('''
import numpy as np
import pytest_arbiter

pytest_arbiter.op("kl_rms", reference=lambda x: np.sqrt(np.mean(
    x.astype(np.float64) ** 2, axis=-1, keepdims=True)))


@pytest_arbiter.candidate("kl_rms", target="cpu", name="kl_rms32")
def rms32(x):
    return np.sqrt(np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32))
''')
    pytester.makepyfile(test_rms='''
import numpy as np
import pytest_arbiter


def test_rms():
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    assert pytest_arbiter.dispatch("kl_rms", x).dtype == np.float32
''')
    result = pytester.runpytest("--arbiter-histogram=h.json")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert _histogram(pytester.path / "h.json") == {("cpu", "kl_rms", "kl_rms32", "won"): 1}


def test_dispatches_in_setup_and_teardown_belong_to_the_test(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(kernlib=KERNLIB, test_fix='''
import numpy as np
import pytest
import kernlib


@pytest.fixture
def scaled():
    kernlib.scale(np.ones(8, np.float32))
    yield
    kernlib.scale(np.ones(8, np.float32))


def test_one(scaled):
    kernlib.scale(np.ones(8, np.float32))


def test_none():
    pass
''')
    result = pytester.runpytest("--junitxml=j.xml")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    props = _properties(pytester.path / "j.xml")
    assert props["test_one"] == {"arbiter:cpu/kl_scale/kl_vector8/won": "3"}
    assert props["test_none"] == {}


def test_library_winners_are_written_by_a_tuning_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mm='''
import numpy as np
import pytest_arbiter


def test_mm():
    a = np.ones((64, 64), np.float32)
    pytest_arbiter.run_measured_arbitrated("matmul", a, a)
    pytest_arbiter.run_arbitrated("matmul", a, a)
    pytest_arbiter.dispatch("matmul", a, a)
    assert pytest_arbiter.default_arbiter().cache is not None
''')
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=c.json",
                                "--arbiter-histogram=h.json")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    cache = artifacts.read_cache(pytester.path / "c.json")
    assert [e.op for e in cache.entries()] == ["matmul"]
    assert sum(_histogram(pytester.path / "h.json").values()) == 3


@pytest.mark.xdist
def test_xdist_workers_gate_library_dispatches_and_name_the_tests(
        pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(kernlib=KERNLIB, test_lib=LIBRARY_TESTS)
    result = pytester.runpytest("-n", "2", "--arbiter-histogram=h.json", "-p",
                                "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*new degraded: target=cpu op=kl_scale candidate=kl_vector8*",
        "*reason: needs a multiple of 8 elements*",
        "*tests: test_lib.py::test_ragged*",
    ])
    assert _histogram(pytester.path / "h.json")[("cpu", "kl_scale", "kl_vector8", "won")] == 1


# -- outside pytest ---------------------------------------------------------------------

PRODUCTION = '''
import json, sys
import numpy as np
import pytest_arbiter

a = np.ones((48, 48), np.float32)
for _ in range(3):
    out = pytest_arbiter.dispatch("matmul", a, a)
assert (out == 48).all()
print(json.dumps(sorted([*k, v] for k, v in pytest_arbiter.dispatch_histogram().items())))
'''


def _production(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_ARBITER_")}
    return subprocess.run([sys.executable, "-c", PRODUCTION], env={**clean, **env},
                          cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_production_dispatch_uses_the_corpus_or_the_tier_order(tmp_path: Path) -> None:
    reg = CandidateRegistry()
    reg.add(REGISTRY.get("dot_matmul"))  # the bundled kernel: the same code in production
    tuner = Arbiter(registry=reg, mode="tune")
    tuner.dispatch("matmul", np.ones((48, 48), np.float32), np.ones((48, 48), np.float32))
    corpus = tmp_path / "corpus.json"
    artifacts.write_cache(corpus, tuner.cache)
    before = corpus.read_bytes()

    with_corpus = _production({"PYTEST_ARBITER_CACHE": str(corpus)}, tmp_path)
    assert with_corpus.returncode == 0, with_corpus.stderr
    assert json.loads(with_corpus.stdout) == [["cpu", "matmul", "dot_matmul", "won", 3]]
    assert corpus.read_bytes() == before  # read only

    without = _production({}, tmp_path)
    assert without.returncode == 0, without.stderr
    assert json.loads(without.stdout) == [["cpu", "matmul", "blas_matmul", "won", 3]]


@pytest.mark.parametrize(("env", "needle"), [
    ({"PYTEST_ARBITER_CACHE": "missing.json"}, "PYTEST_ARBITER_CACHE: cannot read the corpus "
                                               "missing.json: no such file"),
    ({"PYTEST_ARBITER_MODE": "fast"}, "PYTEST_ARBITER_MODE='fast': modes are tune, static, "
                                      "strict"),
    ({"PYTEST_ARBITER_GATE": "maybe"}, "PYTEST_ARBITER_GATE='maybe'"),
])
def test_production_configuration_errors_name_the_variable(
        tmp_path: Path, env: dict[str, str], needle: str) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    done = _production(env, tmp_path)
    assert done.returncode != 0
    assert needle in done.stderr


def test_production_gate_can_be_turned_on(tmp_path: Path) -> None:
    script = '''
import numpy as np
import pytest_arbiter


@pytest_arbiter.candidate("matmul", target="cpu", name="zeros", tier=9)
def zeros(a, b):
    return np.zeros((a.shape[0], b.shape[1]), a.dtype)


a = np.ones((8, 8), np.float32)
assert (pytest_arbiter.dispatch("matmul", a, a) == 8).all()
print(sorted(k[2] + ":" + k[3] for k in pytest_arbiter.dispatch_histogram()))
'''
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_ARBITER_")}
    done = subprocess.run([sys.executable, "-c", script],
                          env={**clean, "PYTEST_ARBITER_GATE": "1"}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['blas_matmul:won', 'zeros:rejected']"


def test_configure_from_code_and_refused_inside_a_run() -> None:
    import pytest_arbiter

    with pytest.raises(pytest_arbiter.ConfigurationError, match="inside a pytest run"):
        pytest_arbiter.configure(mode="static")


def test_a_config_a_test_builds_and_never_runs_does_not_take_its_dispatches(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(kernlib=KERNLIB, test_leak='''
import numpy as np
import kernlib


def test_uses_getitem(pytester):
    pytester.getitem("def test_func():\\n    pass\\n")
    kernlib.scale(np.ones(12, np.float32))
''')
    result = pytester.runpytest("-p", "pytester")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*new degraded: target=cpu op=kl_scale candidate=kl_vector8*",
                                 "*tests: test_leak.py::test_uses_getitem*"])
