"""What a runner can write, a reader refuses when it cannot be right: names outside
the documented character set (at registration), impossible latency rows and forged
counts (naming the file and the entry), and a stale entry's replacement is not a
conflict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.ops import OpRegistry, make_op
from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.corpus import merge
from tests.store.test_cache_file import T0, T1, entry


@pytest.mark.parametrize("name", ["a/b", "k\x1b[2J", "with space", "-lead", "x" * 129])
def test_names_outside_the_rule_are_refused_at_registration(name: str) -> None:
    with pytest.raises(ValueError, match="is not allowed"):
        CandidateRegistry().add(FunctionCandidate(len, name, "matmul", "cpu", 0, None, None))
    with pytest.raises(ValueError, match=r"op name .* is not allowed"):
        OpRegistry().register(make_op(name, lambda x: x))


def test_names_inside_the_rule_register() -> None:
    reg = CandidateRegistry()
    reg.add(FunctionCandidate(len, "cuBLAS-v2.fp16+tf32_x", "matmul", "cpu", 0, None, None))
    assert reg.get("cuBLAS-v2.fp16+tf32_x").name == "cuBLAS-v2.fp16+tf32_x"


@pytest.mark.parametrize("field, value, message", [
    ("q1_ns", 5000, "latencies must satisfy"),
    ("min_ns", 2000, "latencies must satisfy"),
    ("samples", 10**40, "samples"),
])
def test_an_impossible_row_is_refused_naming_the_file_and_the_entry(
        tmp_path: Path, field: str, value: int, message: str) -> None:
    path = tmp_path / "c.json"
    artifacts.write_cache(path, artifacts.MeasureCache([entry()]))
    doc = json.loads(path.read_text())
    doc["entries"][0]["ranking"][0]["stats"][field] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match=message) as raised:
        artifacts.read_cache(path)
    assert "c.json" in str(raised.value) and "entries[0]" in str(raised.value)


def test_all_zero_latencies_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    artifacts.write_cache(path, artifacts.MeasureCache([entry()]))
    doc = json.loads(path.read_text())
    for row in doc["entries"][0]["ranking"]:
        row["stats"].update(median_ns=0, min_ns=0, q1_ns=0, q3_ns=0, max_ns=0)
    path.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="not all be zero"):
        artifacts.read_cache(path)


def test_a_stale_entry_replaced_by_a_later_measurement_is_not_a_conflict() -> None:
    code = {"a": "A" * 16, "b": "B" * 16}
    old = entry(winner="a", runner_up="b", fingerprints=code, since=T0)
    rechecked = entry(winner="b", runner_up="a", fingerprints=code, since=T1, host="h2")
    result = merge([old], [rechecked])
    assert result.entries[old.key] is rechecked and result.conflicts == []
    same_time = entry(winner="b", runner_up="a", fingerprints=code, since=T0, host="h2")
    assert len(merge([old], [same_time]).conflicts) == 1  # the same code, at one time


def test_a_tuning_write_replaces_an_entry_of_other_code_whatever_its_since(
        tmp_path: Path) -> None:
    """A runner whose clock is two hours ahead stamped the corpus's entry; this run
    measured the key against the code that runs now: its entry is kept, not the
    stale one with the later stamp. A plain merge still follows the stamps."""
    import datetime

    path = tmp_path / "c.json"
    ahead = T1 + datetime.timedelta(hours=2)
    stale = entry(winner="old", runner_up="b", fingerprints={"old": "0" * 16}, since=ahead)
    artifacts.write_cache(path, artifacts.MeasureCache([stale]))
    fresh = entry(winner="new", runner_up="b", fingerprints={"new": "1" * 16}, since=T1)
    assert artifacts.update_cache(path, [fresh]).entries[stale.key[:]].winner == "old"
    artifacts.write_cache(path, artifacts.MeasureCache([stale]))
    kept = artifacts.update_cache(path, [fresh], measured_now=True)
    assert next(iter(kept.entries.values())).winner == "new"
    assert artifacts.read_cache(path).entries()[0].winner == "new"


def test_a_usage_error_prints_the_path_escaped(pytester: pytest.Pytester) -> None:
    """A file name with a line break cannot forge a CI log command in a usage error."""
    evil = "b\n::error file=ci.yml::pwned.json"
    (pytester.path / evil).write_text("{not json")
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess(f"--arbiter-baseline={evil}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "--arbiter-baseline: cannot use" in err and "b\\n::error" in err
    assert not any(line.startswith("::error") for line in err.splitlines()), err


def test_a_since_in_the_future_is_refused_naming_the_entry(tmp_path: Path) -> None:
    import datetime

    ahead = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=2)
    with pytest.raises(ValueError, match="is in the future"):
        entry(since=ahead)
    path = tmp_path / "c.json"
    artifacts.write_cache(path, artifacts.MeasureCache([entry(since=T1)]))
    doc = json.loads(path.read_text())
    doc["entries"][0]["since"] = ahead.strftime("%Y-%m-%dT%H:%M:%SZ")
    path.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="clock ahead") as raised:
        artifacts.read_cache(path)
    assert "c.json" in str(raised.value) and "entries[0]" in str(raised.value)
