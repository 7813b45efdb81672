"""The arbiter's hooks: backends and candidates from plugins, and the three reports,
outside pytest (the arbiter's own plugin manager) and inside (conftest files)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from pytest_arbiter.extend import backends
from pytest_arbiter.extend.backends import Backend, BackendTable, DeviceInfo

NPU_PLUGIN = '''
import numpy as np
import pytest_arbiter
from pytest_arbiter import Backend, DeviceInfo, FunctionCandidate, hookimpl

SEEN = {"measured": [], "failed": []}


class NpuBackend(Backend):
    name, targets = "npu", ("npu",)

    def probe(self, target):
        return DeviceInfo("npu-v2", "Acme NPU v2")

    def candidates(self):
        return [FunctionCandidate(np.matmul, "npu_matmul", "matmul", "npu", 0, None, None)]


def wrong(a, b):
    return np.zeros((a.shape[0], b.shape[1]), a.dtype)


class Plugin:
    @hookimpl
    def pytest_arbiter_add_backends(self):
        return [NpuBackend()]

    def pytest_arbiter_add_candidates(self):  # unmarked: found by its name
        return [FunctionCandidate(wrong, "wrong_matmul", "matmul", "cpu", 9, None, None)]

    def pytest_arbiter_candidate_measured(self, entry):
        SEEN["measured"].append([entry.target, entry.winner])

    def pytest_arbiter_gate_failed(self, report):
        SEEN["failed"].append(report.candidate)
'''


def _fresh_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_a_plugin_registered_outside_pytest_brings_a_backend_candidates_and_reports() -> None:
    code = NPU_PLUGIN + textwrap.dedent('''
        import json
        from pytest_arbiter.extend import hooks
        from pytest_arbiter.extend.device import probe_device
        from pytest_arbiter.core.candidates import REGISTRY, known_targets
        hooks.plugin_manager().register(Plugin())
        arb = pytest_arbiter.Arbiter(mode="tune")
        a = np.ones((8, 8), np.float32)
        arb.dispatch("matmul", a, a)
        print(json.dumps([probe_device("npu").tag, "npu" in known_targets(),
                          sorted(c.name for c in REGISTRY.for_op("matmul", "npu")),
                          SEEN["failed"], sorted(SEEN["measured"])]))
    ''')
    tag, known, npu, failed, measured = json.loads(_fresh_python(code))
    assert (tag, known, npu) == ("npu-v2", True, ["npu_matmul"])
    assert failed == ["wrong_matmul"]  # the F4 gate's failure, reported once
    assert measured == [["cpu", measured[0][1]]] and measured[0][1] != "wrong_matmul"


def test_a_plugin_registered_after_the_backends_loaded_still_adds_its_own() -> None:
    code = NPU_PLUGIN + textwrap.dedent('''
        from pytest_arbiter.extend import hooks
        from pytest_arbiter.core.candidates import REGISTRY
        from pytest_arbiter.extend.device import forget, probe_device
        print(probe_device("npu"), "npu_matmul" in REGISTRY, end=" | ")
        hooks.plugin_manager().register(Plugin())
        forget("npu")
        print(probe_device("npu").tag, "npu_matmul" in REGISTRY, "wrong_matmul" in REGISTRY)
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("no backend serves target 'npu' False | "
                                  "npu-v2 True True")


class _Lane(Backend):
    targets = ("lane",)

    def probe(self, target: str) -> DeviceInfo | str:
        return DeviceInfo("lane-1", "lane")


class _OtherLane(_Lane):
    pass


class _Bundled(_Lane):
    fallback = True


def test_a_target_served_twice_is_refused_and_an_installed_backend_replaces_a_bundled_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "register_target", lambda name: None)  # keep it local
    table = BackendTable()
    assert table.add(_Bundled())
    installed = _Lane()
    assert table.add(installed) and table.for_target("lane") is installed
    assert not table.add(_Bundled())  # the bundled lane no longer serves it
    assert table.add(_Lane())  # the same code again (a re-import) replaces it
    with pytest.raises(ValueError, match="served by two backends"):
        table.add(_OtherLane())
    with pytest.raises(TypeError, match=r"must be a pytest_arbiter\.Backend"):
        table.add(object())  # type: ignore[arg-type]


def test_conftest_hooks_see_the_verdict_the_gate_failure_and_the_measured_entry(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest('''
        import json
        import numpy as np
        from pytest_arbiter import FunctionCandidate

        def wrong(a, b):
            return np.zeros((a.shape[0], b.shape[1]), a.dtype)

        def pytest_arbiter_add_candidates():
            return [FunctionCandidate(wrong, "conftest_wrong", "matmul", "cpu", 9,
                                      None, None)]

        def pytest_arbiter_gate_failed(report):
            print("GATE-FAILED", report.candidate)

        def pytest_arbiter_candidate_measured(entry):
            print("MEASURED", entry.target, entry.op)

        def pytest_arbiter_verdict(verdict, counts):
            with open("verdict.json", "w") as f:
                json.dump({"passed": verdict.passed,
                           "outcomes": sorted(k[3] for k in counts)}, f)
    ''')
    pytester.makepyfile(test_one='''
        import numpy as np

        def test_dispatch(arbiter):
            a = np.ones((8, 8), np.float32)
            arbiter.dispatch("matmul", a, a)
    ''')
    result = pytester.runpytest_subprocess("-s", "--arbiter-tune",
                                           "--arbiter-cache=cache.json")
    result.stdout.fnmatch_lines(["*GATE-FAILED conftest_wrong*", "*MEASURED cpu matmul*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the rejected entry fails the gate
    verdict = json.loads((pytester.path / "verdict.json").read_text())
    assert verdict == {"passed": False, "outcomes": ["rejected", "won"]}


def test_the_report_header_names_the_devices_mode_cache_and_baseline(
        pytester: pytest.Pytester) -> None:
    from pytest_arbiter.extend.device import cpu_device

    pytester.makepyfile(test_one="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("--arbiter-baseline=base.json")
    result.stdout.fnmatch_lines([f"arbiter: devices {cpu_device().tag}; mode static; "
                                 "cache none; baseline *base.json"])
