"""The pytest wiring, tested through pytester on small real projects (the objects it
wires are tested without pytest: tests/session/).

The inner runs are in-process (fast); candidates that their conftests register go
into the process-global registry, so an autouse fixture removes them afterwards.
"""

from __future__ import annotations

import io
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_arbiter import REGISTRY
from pytest_arbiter.cli.main import main
from pytest_arbiter.session.settings import ArbiterSettings
from pytest_arbiter.store import artifacts
from tests.factories import make_confident

DECLINING_CONFTEST = """
import pytest_arbiter

pytest_arbiter.op("plugin_mm", reference=lambda a, b: a @ b)

# the only candidate of its op: its decline runs the reference, a degrade
@pytest_arbiter.candidate("plugin_mm", target="cpu", name="plugin_declining", tier=9)
def k(a, b):
    raise pytest_arbiter.Decline("not yet")
"""


DISPATCH_TEST = """
import numpy as np

def test_dispatch(arbiter):
    a = np.ones((4, 3), np.float32)
    b = np.ones((3, 2), np.float32)
    out = arbiter.dispatch("matmul", a, b)
    assert out.shape == (4, 2) and (out == 3).all()
"""
DEGRADE_TEST = DISPATCH_TEST.replace('"matmul"', '"plugin_mm"')


pytestmark = pytest.mark.usefixtures("clean_registry")


def _entries(path: Path) -> list[dict[str, object]]:
    data = json.loads(path.read_text())
    assert data["schema"] == "pytest-arbiter/histogram"
    return list(data["entries"])




def test_help_lists_options_and_markers(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--arbiter-tune*", "*--arbiter-write-baseline=PATH*",
                                 "*arbiter_no_skip*"])
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["*host_free*", "*sm120*", "*device(*tags)*",
                                 "*arbiter_expect_degrade*"])


def test_degrade_fails_without_baseline_and_passes_with_written_one(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest(DECLINING_CONFTEST)
    pytester.makepyfile(test_one=DEGRADE_TEST)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*= arbiter =*",
        "*no --arbiter-baseline given*",
        "*new degraded: target=cpu op=plugin_mm candidate=plugin_declining (1 dispatch)*",
        "*degrade gate FAILED*",
    ])
    result = pytester.runpytest("--arbiter-write-baseline=base.json")
    assert result.ret == 0
    entries = _entries(pytester.path / "base.json")
    assert {"target": "cpu", "op": "plugin_mm", "selected": "plugin_declining",
            "outcome": "degraded", "count": 1} in entries
    result = pytester.runpytest("--arbiter-baseline=base.json")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*degrade gate passed*"])


def test_missing_baseline_counts_as_empty_and_says_so(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(DECLINING_CONFTEST)
    pytester.makepyfile(test_one=DEGRADE_TEST)
    result = pytester.runpytest("--arbiter-baseline=nope.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*baseline *nope.json does not exist yet*"])


def test_expected_degrade_marker_and_fixture_do_not_count(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(DECLINING_CONFTEST)
    pytester.makepyfile(test_one="""
        import numpy as np
        import pytest

        A = np.ones((4, 3), np.float32)
        B = np.ones((3, 2), np.float32)

        @pytest.mark.arbiter_expect_degrade
        def test_marker(arbiter):
            arbiter.dispatch("plugin_mm", A, B)

        def test_fixture_argument(arbiter):
            arbiter.expect_degrade()
            arbiter.dispatch("plugin_mm", A, B)
    """)
    result = pytester.runpytest("--arbiter-histogram=h.json", "--junitxml=report.xml")
    assert result.ret == 0, result.stdout.str()
    # the histogram artifact still records them, saying they were on purpose
    assert [(e["count"], e.get("expected")) for e in _entries(pytester.path / "h.json")
            if e["outcome"] == "degraded"] == [(2, 2)]
    # and the fleet gate on the JUnit report leaves them out as the run's own gate did
    report = str(pytester.path / "report.xml")
    baseline = str(pytester.path / "none-yet.json")
    assert main(["gate", "--baseline", baseline, report], out=io.StringIO()) == 0
    text = (pytester.path / "report.xml").read_text()
    assert text.count('name="arbiter-expect-degrade"') == 2
    # without the marker property the same dispatches are a new degrade
    (pytester.path / "bare.xml").write_text(text.replace("arbiter-expect-degrade", "other"))
    assert main(["gate", "--baseline", baseline, str(pytester.path / "bare.xml")],
                out=io.StringIO()) == 1
    # the same holds for the histogram file; a bad "expected" is unreadable input
    histogram = pytester.path / "h.json"
    assert main(["gate", "--baseline", baseline, str(histogram)], out=io.StringIO()) == 0
    data = json.loads(histogram.read_text())
    del data["total"]  # a hand edit: the check total would (rightly) refuse it
    for entry in data["entries"]:
        entry.pop("expected", None)
    histogram.write_text(json.dumps(data))
    assert main(["gate", "--baseline", baseline, str(histogram)], out=io.StringIO()) == 1
    data["entries"][0]["expected"] = data["entries"][0]["count"] + 1
    histogram.write_text(json.dumps(data))
    assert main(["gate", "--baseline", baseline, str(histogram)], out=io.StringIO()) == 2


def test_ini_keys_are_read(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(DECLINING_CONFTEST)
    pytester.makepyfile(test_one=DEGRADE_TEST)
    pytester.makeini("[pytest]\narbiter_histogram = out/h.json\n")
    (pytester.path / "out").mkdir()
    result = pytester.runpytest("--arbiter-write-baseline=base.json")
    assert result.ret == 0
    assert (pytester.path / "out" / "h.json").exists()


RAGGED_CONFTEST = """
import numpy as np
import pytest_arbiter

def aligned(a, b):
    m, k = a.shape
    return (isinstance(a, np.ndarray) and m % 16 == 0 and b.shape[1] % 8 == 0
            and k % 16 == 0)

@pytest_arbiter.candidate("matmul", target="cpu", name="plugin_aligned", tier=5,
                          accepts=aligned)
def aligned_matmul(a, b):
    return np.matmul(a, b)

@pytest_arbiter.candidate("matmul", target="cpu", name="plugin_fast_wrong", tier=8)
def fast_wrong(a, b):
    return np.zeros((a.shape[0], b.shape[1]), a.dtype)
"""


def test_tune_ragged_shape_never_degrades_and_wrong_kernel_never_wins(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest(RAGGED_CONFTEST)
    pytester.makepyfile(test_one="""
        import numpy as np

        def test_ragged(arbiter):
            rng = np.random.default_rng(0)
            for m in (32, 24):
                a = rng.standard_normal((m, 32)).astype(np.float32)
                b = rng.standard_normal((32, 16)).astype(np.float32)
                np.testing.assert_allclose(arbiter.dispatch("matmul", a, b), a @ b,
                                           rtol=1e-4, atol=1e-4)
    """)
    result = pytester.runpytest(
        "--arbiter-tune", "--arbiter-cache=cache.json", "--arbiter-histogram=h.json",
        "--arbiter-explain")
    # the wrong kernel is passed over on both keys, and that fails the run: rejected
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*new rejected: target=cpu op=matmul candidate=plugin_fast_wrong (2 dispatches)*"])
    entries = _entries(pytester.path / "h.json")
    assert entries and not [e for e in entries if e["outcome"] != "won"
                            and e["selected"] != "plugin_fast_wrong"]
    assert sum(e["count"] for e in entries if e["outcome"] == "won") == 2
    cache = artifacts.read_cache(pytester.path / "cache.json").entries()
    assert len(cache) == 2 and "plugin_fast_wrong" not in {e.winner for e in cache}
    for entry in cache:
        assert "plugin_fast_wrong" not in [r.name for r in entry.ranking]
    result.stdout.fnmatch_lines(["*2 measured*",
                                 "*passed over plugin_fast_wrong: failed the F4 gate*"])
    explained = result.stdout.str()
    assert "passed over plugin_aligned: declined the inputs" in explained  # the 24-row key
    assert "slower by" in explained  # the measured keys' runners-up, with the margin
    assert explained.count("passed over") >= 4
    # a second run reuses the cache and measures nothing (a tuning run measures again
    # only a low-confidence pick: on a loaded machine the first comparison may end so),
    # and still shows the broken kernel, as the tuning run did: a baseline written from
    # either run keeps it
    for extra in (["--arbiter-tune"], []):
        low = sum(e.low_confidence
                  for e in artifacts.read_cache(pytester.path / "cache.json").entries())
        again = low if extra else 0
        result = pytester.runpytest(*extra, "--arbiter-cache=cache.json")
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines([
            f"*{again} measured, {2 - again} reused from cache*",
            "*new rejected: target=cpu op=matmul candidate=plugin_fast_wrong (2 dispatches)*",
            "*reason: when measured: failed the F4 gate: output is all zeros*"])


def test_strict_mode_cache_miss_is_an_error(pytester: pytest.Pytester) -> None:
    from pytest_arbiter.store import artifacts
    from pytest_arbiter.store.cache import MeasureCache

    pytester.makepyfile(test_one=DISPATCH_TEST)
    artifacts.write_cache(pytester.path / "corpus.json", MeasureCache())
    result = pytester.runpytest("--arbiter-strict", "--arbiter-cache=corpus.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*CacheMiss*strict mode: no cached winner*"])
    # the arbiter's summary counts the refusal: never one line saying all is well
    result.stdout.fnmatch_lines(["--arbiter-strict refused 1 dispatch (1 for no cached "
                                 "winner): each raised pytest_arbiter.CacheMiss into its "
                                 "caller*"])


@pytest.mark.parametrize(("args", "needle"), [
    (("--arbiter-strict",), "*--arbiter-strict needs the corpus to replay*"),
    (("--arbiter-strict", "--arbiter-cache=typo.json"),
     "*--arbiter-strict: the corpus *typo.json does not exist*"),
    (("--arbiter-strict", "--arbiter-tune", "--arbiter-cache=c.json"),
     "*--arbiter-strict and --arbiter-tune cannot be combined*"),
])
def test_strict_without_a_corpus_or_with_tune_is_one_usage_error(
        pytester: pytest.Pytester, args: tuple[str, ...], needle: str) -> None:
    pytester.makepyfile(test_one=DISPATCH_TEST)
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([needle])
    assert "passed" not in result.stdout.str() and "failed" not in result.stdout.str()


def test_unreadable_cache_is_a_usage_error_naming_the_path(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=DISPATCH_TEST)
    (pytester.path / "bad.json").write_text("{not json")
    result = pytester.runpytest("--arbiter-cache=bad.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad.json*not valid JSON*"])


def test_an_unwritable_artifact_path_is_a_usage_error_before_any_test_runs(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=DISPATCH_TEST)
    pytester.makefile(".txt", blocker="a file where a folder should be")
    for flag in ("--arbiter-histogram", "--arbiter-write-baseline"):
        result = pytester.runpytest(f"{flag}=blocker.txt/h.json")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*{flag}: cannot write */blocker.txt/h.json: "
                                     "*/blocker.txt is a file, not a folder*"])
        assert "test_dispatch" not in result.stdout.str()
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=blocker.txt/c.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--arbiter-cache: cannot write */blocker.txt/c.json*"])


def test_a_missing_artifact_folder_is_created_as_junitxml_does(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=DISPATCH_TEST)
    result = pytester.runpytest("--junitxml=reports/x.xml",
                                "--arbiter-histogram=reports/h.json",
                                "--arbiter-write-baseline=base/line/b.json")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    for path in ("reports/x.xml", "reports/h.json", "base/line/b.json"):
        assert (pytester.path / path).is_file(), path


DEVICE_TESTS = """
import pytest

@pytest.mark.arbiter_device("sm_90", "gfx1151")
def test_gpu():
    pass

@pytest.mark.sm120
def test_blackwell():
    pass

@pytest.mark.arbiter_device("cpu")
@pytest.mark.host_free
def test_cpu():
    pass
"""


def test_device_skip_reason_names_needed_and_found(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_dev=DEVICE_TESTS)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines([
        "*test_dev.py:*needs device 'sm_90' or 'gfx1151'; found device tags: cpu*",
        "*needs device 'sm_120'; found device tags: cpu*",
    ])


def test_no_skip_turns_missing_device_into_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_dev=DEVICE_TESTS)
    result = pytester.runpytest("--arbiter-no-skip")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*--arbiter-no-skip: failing instead of skipping*"])


def test_strict_markers_reject_unknown_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bad="""
        import pytest

        @pytest.mark.devcie("sm_90")
        def test_typo():
            pass
    """)
    result = pytester.runpytest("--strict-markers")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*'devcie' not found in `markers`*"])


def test_junit_properties_under_warnings_as_errors(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=DISPATCH_TEST)
    # a process of its own: in-process, whether the inner run may rewrite the already
    # imported plugin's asserts depends on what earlier tests imported (a warning, an
    # error under -W error), which says nothing about a user's run
    result = pytester.runpytest_subprocess("-W", "error", "--junitxml=out.xml",
                                           "-o", "junit_family=xunit2")
    assert result.ret == 0
    root = ET.parse(pytester.path / "out.xml").getroot()
    props = {p.get("name"): p.get("value")
             for case in root.iter("testcase") for p in case.iter("property")}
    assert props == {"arbiter:cpu/matmul/blas_matmul/won": "1"}
    suite = root.find("testsuite/properties")
    assert suite is not None and {p.get("name"): p.get("value") for p in suite} == {
        "arbiter-report": "1", "arbiter-total:cpu/matmul/blas_matmul/won": "1",
        # what the run saw of its candidates: the proof a baseline entry is fixed
        "arbiter-checked:cpu/matmul/blas_matmul": "1",
        **{f"arbiter-registered:cpu/matmul/{name}": "1"
           for name in ("blas_matmul", "dot_matmul", "panel_matmul")}}


def test_gate_matrix_parametrize_one_item_per_case(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_matrix="""
        import pytest
        from pytest_arbiter import REGISTRY, gate_matrix

        @pytest.mark.parametrize("arbiter_case", gate_matrix(
            "matmul", [(32, 16, 32), (24, 16, 32)], ["float32", "float16"]))
        def test_gate(arbiter, arbiter_case):
            arbiter.gate_case(arbiter_case)
    """)
    result = pytester.runpytest("-v")
    result.stdout.fnmatch_lines([
        "*test_gate?blas_matmul-32x16x32-float32? PASSED*",
        "*test_gate?dot_matmul-24x16x32-float16? PASSED*",
        "*test_gate?panel_matmul-24x16x32-float32? SKIPPED*",
    ])
    # every other bundled matmul candidate is a GPU lane: unavailable here, so skipped
    gpu = len(REGISTRY.for_op("matmul")) - len(REGISTRY.for_op("matmul", "cpu"))
    assert gpu > 0
    result.assert_outcomes(passed=8, skipped=4 + gpu * 4)
    result = pytester.runpytest("-rs")
    result.stdout.fnmatch_lines(["*SKIPPED*candidate 'cublas_matmul' (target nvidia) is "
                                 "unavailable here*"])


def test_gate_on_inputs_skips_a_candidate_whose_package_is_missing(
        pytester: pytest.Pytester) -> None:
    """``arbiter.gate(name, *inputs)`` of a candidate unavailable here skips with its
    ``available()`` reason, as a gate_matrix case does, instead of failing on the
    missing package's ImportError; an available one is gated as before."""
    pytester.makeconftest("""
import numpy as np
import pytest_arbiter

pytest_arbiter.op("skip_scale", reference=lambda x: x * 2)


@pytest_arbiter.candidate("skip_scale", target="cpu", name="skip_plain")
def plain(x):
    return x * 2


@pytest_arbiter.candidate("skip_scale", target="cpu", name="skip_torch",
                          available=lambda: "torch is not installed (pip install torch)")
def with_torch(x):
    import torch_not_here  # noqa: F401
    return x * 2
""")
    pytester.makepyfile(test_gate="""
import numpy as np
import pytest
from pytest_arbiter import SoftmaxRegion


@pytest.mark.parametrize("name", ["skip_plain", "skip_torch"])
def test_gate(arbiter, name):
    arbiter.gate(name, np.arange(8.0))


def test_region(arbiter):
    arbiter.gate_region("stable_softmax", SoftmaxRegion.of((4, 8), "float32"))
""")
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=2, skipped=1)
    # the skip points at the test's line, not at the plugin's fixture
    result.stdout.fnmatch_lines(["*SKIPPED*test_gate.py:*: candidate 'skip_torch' (target cpu) is "
                                 "unavailable here: torch is not installed (pip install "
                                 "torch)*"])


def test_gate_on_inputs_a_candidate_does_not_accept_skips_as_gate_case_does(
        pytester: pytest.Pytester) -> None:
    """``arbiter.gate(name, *inputs)`` of inputs the candidate's ``accepts()`` turns down
    skips, saying so, as a gate_matrix case does; a ``Decline`` raised by its run still
    fails the gate (the kernel took the inputs)."""
    pytester.makeconftest("""
import numpy as np
import pytest_arbiter

pytest_arbiter.op("acc_scale", reference=lambda x: x * 2)


@pytest_arbiter.candidate("acc_scale", target="cpu", name="acc_f32",
                          accepts=lambda x: x.dtype == np.float32)
def only_f32(x):
    return x * 2


@pytest_arbiter.candidate("acc_scale", target="cpu", name="acc_raises")
def raises(x):
    raise pytest_arbiter.Decline("never")
""")
    pytester.makepyfile(test_gate="""
import numpy as np


def test_refused(arbiter):
    arbiter.gate("acc_f32", np.arange(8.0))


def test_declined_in_the_run(arbiter):
    arbiter.gate("acc_raises", np.arange(8.0))
""")
    result = pytester.runpytest("-rsf")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*test_gate.py:*: candidate 'acc_f32' does not "
                                 "accept these inputs "
                                 "(accepts() returned False for every gate input)*",
                                 "*FAILED test_gate.py::test_declined_in_the_run*"])


@pytest.mark.parametrize(("shapes", "dtypes", "says"), [
    ([(8, 8)], ["float32"], "a matmul gate case needs (m, n, k), got (8, 8)"),
    ([(8, 8, 8)], ["float33"], "unknown dtype 'float33'"),
])
def test_gate_matrix_refuses_a_case_it_cannot_gate_at_collection(
        shapes: list[tuple[int, ...]], dtypes: list[str], says: str) -> None:
    from pytest_arbiter import gate_matrix

    with pytest.raises(ValueError, match=re.escape(says)):
        gate_matrix("matmul", shapes, dtypes)


def test_gate_case_failure_reports_the_summary(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        import numpy as np
        import pytest_arbiter

        @pytest_arbiter.candidate("softmax", target="cpu", name="plugin_bad_softmax")
        def bad(x):
            return np.zeros_like(x)
    """)
    pytester.makepyfile(test_matrix="""
        import pytest
        from pytest_arbiter import REGISTRY, gate_matrix

        @pytest.mark.parametrize("arbiter_case", [
            c for c in gate_matrix("softmax", [(4, 10)], ["float32"])
            if c.candidate == "plugin_bad_softmax"])
        def test_gate(arbiter, arbiter_case):
            arbiter.gate_case(arbiter_case)
    """)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*F4 gate FAILED: candidate 'plugin_bad_softmax'*",
                                 "*budget:*"])


@pytest.mark.xdist
def test_xdist_controller_merges_workers_and_names_a_crashed_one(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("xdist")
    pytester.makeconftest(DECLINING_CONFTEST)
    pytester.makepyfile(test_one="""
        import os
        import numpy as np
        import pytest

        A = np.ones((4, 3), np.float32)
        B = np.ones((3, 2), np.float32)

        @pytest.mark.parametrize("i", range(8))
        def test_dispatch(arbiter, i):
            arbiter.dispatch("plugin_mm", A, B)

        @pytest.mark.arbiter_expect_degrade
        def test_on_purpose(arbiter):
            arbiter.dispatch("plugin_mm", A, B)

        def test_crash():
            if os.environ.get("ARBITER_TEST_CRASH"):
                os._exit(3)
    """)
    # pytest-benchmark warns that xdist disables it; this project runs with -W error
    result = pytester.runpytest("-n", "2", "-p", "no:benchmark",
                                "--arbiter-write-baseline=base.json")
    assert result.ret == 0, result.stdout.str()
    entries = _entries(pytester.path / "base.json")
    # the on-purpose test's degrade adds nothing to the baseline
    assert [e["count"] for e in entries if e["selected"] == "plugin_declining"] == [8]
    result.stdout.fnmatch_lines(["*new degraded: *candidate=plugin_declining (8 dispatches)*"])

    monkeypatch.setenv("ARBITER_TEST_CRASH", "1")
    result = pytester.runpytest("-n", "2", "-p", "no:benchmark", "-v",
                                "--arbiter-baseline=base.json", "--arbiter-histogram=h.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    crashed = re.findall(r"worker (gw\d+) returned no arbiter data \(crashed\?\)", out)
    assert len(crashed) == 1, out
    # the crashed worker's dispatches are lost with it: the run fails, and neither the
    # histogram nor a baseline is written from counts known to be incomplete
    assert not (pytester.path / "h.json").exists()
    result.stdout.fnmatch_lines([f"*--arbiter-histogram *h.json not written: the run's counts "
                                 f"are incomplete (worker {crashed[0]} crashed)*"])
    monkeypatch.delenv("ARBITER_TEST_CRASH")
    before = (pytester.path / "base.json").read_bytes()
    monkeypatch.setenv("ARBITER_TEST_CRASH", "1")
    result = pytester.runpytest("-n", "2", "-p", "no:benchmark",
                                "--arbiter-write-baseline=base.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert (pytester.path / "base.json").read_bytes() == before  # the baseline is intact


TUNE_PROJECT = """
    import numpy as np
    import pytest

    SHAPES = [(4, 3, 2), (32, 32, 16), (24, 32, 16), (7, 5, 3)]

    @pytest.mark.parametrize("shape", SHAPES)
    @pytest.mark.parametrize("rep", range(3))
    def test_matmul(arbiter, shape, rep):
        m, k, n = shape
        a = np.ones((m, k), np.float32)
        b = np.ones((k, n), np.float32)
        assert (arbiter.dispatch("matmul", a, b) == k).all()

    @pytest.mark.parametrize("rows", [1, 8, 33])
    def test_softmax(arbiter, rows):
        out = arbiter.dispatch("softmax", np.zeros((rows, 16), np.float32))
        assert np.allclose(out.sum(axis=-1), 1.0)
"""


def _totals(path: Path) -> dict[tuple[str, str, str], int]:
    """Histogram totals per (target, op, outcome): the winner may differ between runs."""
    totals: dict[tuple[str, str, str], int] = {}
    for e in _entries(path):
        key = (str(e["target"]), str(e["op"]), str(e["outcome"]))
        totals[key] = totals.get(key, 0) + int(str(e["count"]))
    return totals


@pytest.mark.xdist
def test_xdist_tune_gives_the_same_histogram_totals_as_one_process(
        pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_tune=TUNE_PROJECT)
    # workers send the controller only the cache entries they measured
    pytester.makeconftest("""
        import pathlib

        def pytest_testnodedown(node, error):
            payload = node.workeroutput["arbiter"]["cache"]
            sent = len(payload["entries"]) if payload else 0
            with pathlib.Path("sent.txt").open("a") as out:
                out.write(f"{sent}\\n")
    """)
    one = pytester.runpytest("-n", "0", "-p", "no:benchmark", "--arbiter-tune",
                             "--arbiter-histogram=one.json", "--arbiter-cache=one-cache.json")
    assert one.ret == 0, one.stdout.str()
    two = pytester.runpytest("-n", "2", "-p", "no:benchmark", "--arbiter-tune",
                             "--arbiter-histogram=two.json", "--arbiter-cache=two-cache.json")
    assert two.ret == 0, two.stdout.str()
    expected = {("cpu", "matmul", "won"): 12, ("cpu", "softmax", "won"): 3}
    assert _totals(pytester.path / "one.json") == expected
    assert _totals(pytester.path / "two.json") == expected
    # the controller wrote one cache holding every worker's measured keys
    keys = {(e.op, e.bucket) for e in artifacts.read_cache(pytester.path / "two-cache.json")}
    assert len(keys) == 7
    sent = pytester.path / "sent.txt"
    assert sum(int(n) for n in sent.read_text().split()) >= 7
    sent.unlink()
    # replaying with that cache, the workers measure nothing and send nothing back, and
    # the file is left alone (a low-confidence pick, of these near-tied bundled kernels
    # on a loaded machine, is measured again: then it is written back)
    low = sum(e.low_confidence for e in artifacts.read_cache(pytester.path / "two-cache.json"))
    written = (pytester.path / "two-cache.json").read_bytes()
    os.utime(pytester.path / "two-cache.json", ns=(0, 0))
    again = pytester.runpytest("-n", "2", "-p", "no:benchmark", "--arbiter-tune",
                               "--arbiter-cache=two-cache.json")
    assert again.ret == 0, again.stdout.str()
    again.stdout.fnmatch_lines([f"*{low} measured, {7 - low} reused from cache*"])
    if not low:
        assert sent.read_text().split() == ["0", "0"]
        assert (pytester.path / "two-cache.json").read_bytes() == written
        assert (pytester.path / "two-cache.json").stat().st_mtime_ns == 0
    assert len(json.loads((pytester.path / "two-cache.json").read_text())["entries"]) == 7


def test_plugin_loads_and_gates_with_xdist_disabled(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(DECLINING_CONFTEST)
    pytester.makepyfile(test_one=DEGRADE_TEST)
    result = pytester.runpytest("-p", "no:xdist", "-p", "no:benchmark")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*new degraded: target=cpu op=plugin_mm "
                                 "candidate=plugin_declining (1 dispatch)*"])


def test_worker_device_environment_round_robins_workers() -> None:
    from pytest_arbiter.extend.device import worker_device_environment

    assert worker_device_environment("gw0", ["0", "1"]) == {
        "CUDA_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0"}
    assert worker_device_environment("gw3", ["0", "1"])["CUDA_VISIBLE_DEVICES"] == "1"
    assert worker_device_environment("gw7", ["GPU-a1b2"])["HIP_VISIBLE_DEVICES"] == "GPU-a1b2"
    with pytest.raises(ValueError, match="'master' is not of the form gwN"):
        worker_device_environment("master", ["0"])
    with pytest.raises(ValueError, match="no devices"):
        worker_device_environment("gw0", [])


@pytest.mark.xdist
def test_each_xdist_worker_sees_only_its_own_device(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_env="""
        import os
        import pytest

        @pytest.mark.parametrize("i", range(6))
        def test_record(i, tmp_path_factory):
            worker = os.environ["PYTEST_XDIST_WORKER"]
            out = tmp_path_factory.getbasetemp().parent.parent / f"seen-{worker}-{i}"
            out.write_text(os.environ["CUDA_VISIBLE_DEVICES"] + " "
                           + os.environ["HIP_VISIBLE_DEVICES"])
    """)
    result = pytester.runpytest("-n", "2", "-p", "no:benchmark",
                                "--arbiter-worker-devices=3, 5")
    assert result.ret == 0, result.stdout.str()
    seen = {}
    for path in pytester.path.parent.rglob("seen-gw*"):
        seen.setdefault(path.name.split("-")[1], set()).add(path.read_text())
    assert seen == {"gw0": {"3 3"}, "gw1": {"5 5"}}


@pytest.mark.parametrize(("given", "bad"), [("0,,1", "''"), ("a,b", "'a'"),
                                            ("0, gpu0", "'gpu0'")])
def test_bad_worker_device_list_is_a_usage_error(pytester: pytest.Pytester, given: str,
                                                 bad: str) -> None:
    pytester.makepyfile(test_one="def test_ok():\n    pass\n")
    result = pytester.runpytest(f"--arbiter-worker-devices={given}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*--arbiter-worker-devices (ini arbiter_worker_devices): {bad} in * is not a "
         "device index or a GPU-/MIG- UUID*"])


def test_a_run_that_never_dispatches_builds_no_arbiter(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_idle="""
        import sys

        def test_a():
            pass

        def test_zz_last():
            print("LOADED", "numpy" in sys.modules,
                  "pytest_arbiter.decision.arbiter" in sys.modules)
    """)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider",
                                           "--arbiter-histogram=h.json")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*LOADED False False*"])
    assert _entries(pytester.path / "h.json") == []


def test_workers_entries_replace_what_was_read_and_resolve_by_the_merge_rule(
        tmp_path: Path) -> None:
    from types import SimpleNamespace

    from pytest_arbiter.plugin import ArbiterSession
    from pytest_arbiter.store import artifacts
    from pytest_arbiter.store.cache import CacheEntry, MeasureCache, RankedCandidate
    from pytest_arbiter.timing.measure import LatencyStats

    def entry(winner: str, confidence: float, host: str) -> CacheEntry:
        stats = LatencyStats(1000.0, 900.0, 950.0, 1050.0, 1200.0, 25)
        return CacheEntry("dev0", "cpu", "matmul", "32x16x32/a16.16.16", "float32",
                          (RankedCandidate(winner, stats),), confidence, False, {},
                          {"host": host})

    corpus = tmp_path / "corpus.json"
    artifacts.write_cache(corpus, MeasureCache([entry("old", 0.9999, "committed")]))
    session = ArbiterSession(SimpleNamespace(), ArbiterSettings(cache=corpus))  # type: ignore[arg-type]
    key = entry("x", 1.0, "x").key
    ledger = session.ledger
    session.get_arbiter()  # the run's arbiter, on the cache it read
    # what a worker measured this run replaces what the run read, even a surer entry
    ledger.take_measured([entry("first", 0.95, "gw0")])
    assert session.get_arbiter().cache.get(key).winner == "first"  # type: ignore[union-attr]
    # between two workers' entries the merge rule decides, whichever arrives last
    ledger.take_measured([entry("weaker", 0.90, "gw1")])
    assert session.get_arbiter().cache.get(key).winner == "first"  # type: ignore[union-attr]
    ledger.take_measured([entry("surer", 0.99, "gw2")])
    assert session.get_arbiter().cache.get(key).winner == "surer"  # type: ignore[union-attr]


def test_tune_run_fails_on_a_candidate_that_declines_in_the_gate(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
import pytest_arbiter

@pytest_arbiter.candidate("matmul", target="cpu", name="plugin_declining", tier=9)
def k(a, b):
    raise pytest_arbiter.Decline("not yet")
""")
    pytester.makepyfile(test_one=DISPATCH_TEST)
    result = pytester.runpytest("--arbiter-tune", "--arbiter-explain")
    # the other bundled candidates pass the gate and win: nothing degrades
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*passed over plugin_declining: declined: not yet*"])
    pytester.makepyfile(test_one="""
        import numpy as np

        def test_dispatch(arbiter):
            arbiter.dispatch("plugin_scale3", np.ones(4))
    """)
    pytester.makeconftest(DECLINING_CONFTEST + """
import numpy as np

pytest_arbiter.op("plugin_scale3", reference=lambda x: x * 3)

@pytest_arbiter.candidate("plugin_scale3", target="cpu", name="scale3_declines")
def scale3(x):
    raise pytest_arbiter.Decline("not yet")
""")
    result = pytester.runpytest("--arbiter-tune")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*new degraded: target=cpu op=plugin_scale3 "
                                 "candidate=scale3_declines (1 dispatch)*"])


def test_summary_says_whether_the_cache_was_read(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=DISPATCH_TEST)
    # a tune with nowhere to write says so, never throws its measurements away silently
    result = pytester.runpytest("--arbiter-tune")
    result.stdout.fnmatch_lines(["*--arbiter-tune without --arbiter-cache: 1 measured entry "
                                 "kept in memory only, not written (pass "
                                 "--arbiter-cache=PATH)*"])
    result = pytester.runpytest("--arbiter-cache=typo/corpus.json")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*cache *typo/corpus.json does not exist: every key falls "
                                 "to the static tier order*", "*1 static tier order on a miss*"])
    result = pytester.runpytest("--arbiter-cache=c.json", "--arbiter-tune")
    result.stdout.fnmatch_lines(["*cache *c.json does not exist yet: this run creates it*"])
    make_confident(pytester.path / "c.json")
    # a clean run says it in one line; -v lists the winners
    result = pytester.runpytest("--arbiter-cache=c.json")
    result.stdout.fnmatch_lines(["*cache *c.json: 1 entry read; 1 dispatch (1 won); "
                                 "keys: 0 measured, 1 reused from cache*; degrade gate "
                                 "passed*(-v for details)"])
    assert "winners:" not in result.stdout.str()
    result = pytester.runpytest("--arbiter-cache=c.json", "-v")
    result.stdout.fnmatch_lines(["*cache *c.json: 1 entry read*", "*1 reused from cache*",
                                 "winners:", "  cpu/matmul/4x2x4/a4.2.1/float32: *_matmul "
                                 "(reused from cache)"])


def test_fixed_entries_only_for_what_the_run_dispatched(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=DISPATCH_TEST)
    baseline = {"schema": "pytest-arbiter/histogram", "version": 1, "entries": [
        {"target": "cpu", "op": "matmul", "selected": "gone_kernel", "outcome": "degraded",
         "count": 2},
        {"target": "nvidia", "op": "matmul", "selected": "wmma", "outcome": "degraded",
         "count": 1}]}
    (pytester.path / "base.json").write_text(json.dumps(baseline))
    result = pytester.runpytest("--arbiter-baseline=base.json")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*fixed degraded: target=cpu op=matmul candidate=gone_kernel*tighten the baseline*",
        "*1 baseline entries not checked: this run did not dispatch their target and op*",
        "*degrade gate passed*"])
    assert "candidate=wmma" not in result.stdout.str()


def test_the_session_end_empties_the_cache_and_ends_the_arbiter(tmp_path: Path) -> None:
    """A failed last test's traceback can keep the arbiter, and so the cache, alive past
    pytest_unconfigure: the session empties the cache itself."""
    from types import SimpleNamespace

    from pytest_arbiter.plugin import ArbiterSession
    from pytest_arbiter.store.cache import CacheEntry, MeasureCache, RankedCandidate
    from pytest_arbiter.timing.measure import LatencyStats

    stats = LatencyStats(1000.0, 900.0, 950.0, 1050.0, 1200.0, 5)
    corpus = tmp_path / "corpus.json"
    artifacts.write_cache(corpus, MeasureCache(
        [CacheEntry("d", "cpu", "matmul", "b", "float32", (RankedCandidate("k", stats),))]))
    config = SimpleNamespace()
    session = ArbiterSession(config, ArbiterSettings(cache=corpus))  # type: ignore[arg-type]
    held = session.get_arbiter().cache  # what a traceback's frames could hold
    assert len(held) == 1
    session.pytest_unconfigure(config)  # type: ignore[arg-type]
    assert len(held) == 0
    with pytest.raises(RuntimeError, match="the pytest-arbiter session has ended"):
        session.get_arbiter()


def test_a_test_that_degrades_on_purpose_is_never_named_behind_a_new_entry(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
import numpy as np
import pytest_arbiter

pytest_arbiter.op("purpose_double", reference=lambda x: x * 2)

@pytest_arbiter.candidate("purpose_double", target="cpu", tier=10)
def small_only(x):
    if x.size > 4:
        raise pytest_arbiter.Decline("only up to 4 elements")
    return x * 2
""")
    pytester.makepyfile(test_lib="""
import numpy as np
import pytest
import pytest_arbiter

def test_odd():
    assert (pytest_arbiter.dispatch("purpose_double", np.ones(7, np.float32)) == 2).all()

@pytest.mark.arbiter_expect_degrade
def test_odd_on_purpose():
    assert (pytest_arbiter.dispatch("purpose_double", np.ones(5, np.float32)) == 2).all()
""")
    result = pytester.runpytest_subprocess("--junitxml=r.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*new degraded: target=cpu op=purpose_double "
                                 "candidate=small_only*", "    tests: test_lib.py::test_odd"])
    out = io.StringIO()
    assert main(["gate", "--baseline", str(pytester.path / "none.json"),
                 str(pytester.path / "r.xml")], out=out) == 1
    assert "in test_lib.py::test_odd\n" in out.getvalue(), out.getvalue()


def test_idle_tests_get_no_arbiter_bookkeeping(pytester: pytest.Pytester) -> None:
    """A test is tracked only once something dispatched; a fixture's teardown counts."""
    pytester.makepyfile(
        """
        import numpy as np
        import pytest

        @pytest.fixture
        def dispatch_on_teardown(arbiter):
            yield
            a = np.ones((4, 4), np.float32)
            arbiter.dispatch("matmul", a, a)

        def test_hooks(request):
            session = request.config.pluginmanager.get_plugin("arbiter-session")
            assert session._arbiter is None  # nothing dispatched yet: no bookkeeping
            assert not request.config.pluginmanager.has_plugin("arbiter-no-skip")

        def test_idle():
            pass

        def test_busy(arbiter, dispatch_on_teardown):
            a = np.ones((4, 4), np.float32)
            arbiter.dispatch("matmul", a, a)

        """)
    result = pytester.runpytest("--junitxml=out.xml")
    result.assert_outcomes(passed=3)
    xml = (pytester.path / "out.xml").read_text()
    busy = xml[xml.index('name="test_busy"'):]
    busy = busy[:busy.index("</testcase>")]
    assert 'value="2"' in busy and "arbiter:cpu/matmul/" in busy
    idle = xml[xml.index('name="test_idle"'):]
    idle = idle[:idle.index("/>") + 2]
    assert "arbiter:" not in idle
