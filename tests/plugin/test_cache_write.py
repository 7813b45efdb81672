"""The plugin's cache write under ``--arbiter-tune``: merged into the file under its
lock, keeping what other writers added, adding only what the run measured, and a
truncated file a usage error that writes nothing."""

from __future__ import annotations

import os

import pytest

from pytest_arbiter.extend.device import cpu_device
from pytest_arbiter.store import artifacts
from tests.factories import cache_bytes, cache_entry, make_confident

TUNE_TEST = """
import numpy as np
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, RankedCandidate
from pytest_arbiter.timing.measure import LatencyStats

def test_tune(arbiter):
    a = np.ones((16, 16), np.float32)
    arbiter.dispatch("matmul", a, a)
    # another runner adds an entry to the same cache while this run is going
    other = CacheEntry("other-runner-device", "cpu", "matmul", "b", "float32",
                       (RankedCandidate("k", LatencyStats(1.0, 1.0, 1.0, 1.0, 1.0, 3)),))
    artifacts.update_cache("cache.json", [other])
"""


def test_tune_merges_into_the_cache_and_keeps_what_others_wrote(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_tune=TUNE_TEST)
    cache_bytes(pytester.path / "cache.json", cache_entry("from-the-corpus"))
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=cache.json")
    assert result.ret == 0, result.stdout.str()
    devices = {e.device: e.bucket for e in artifacts.read_cache(pytester.path / "cache.json")}
    assert devices.pop("other-runner-device") == "b"
    assert devices.pop("dev0") == "from-the-corpus"
    assert list(devices) == [cpu_device().tag]


FORGET_TEST = """
import numpy as np
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import MeasureCache

def test_tune(arbiter):
    a = np.ones((16, 16), np.float32)
    arbiter.dispatch("matmul", a, a)
    # someone deletes the corpus's other entries while this run is going
    kept = [e for e in artifacts.read_cache("cache.json") if e.bucket != "forgotten"]
    artifacts.write_cache("cache.json", MeasureCache(kept))
"""


def test_tune_adds_only_what_it_measured(pytester: pytest.Pytester) -> None:
    """The run read the entry that was deleted during it; it must not bring it back."""
    pytester.makepyfile(test_tune=FORGET_TEST)
    cache_bytes(pytester.path / "cache.json", cache_entry("forgotten"), cache_entry("kept"))
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=cache.json")
    assert result.ret == 0, result.stdout.str()
    buckets = {e.bucket for e in artifacts.read_cache(pytester.path / "cache.json")}
    assert "forgotten" not in buckets and "kept" in buckets and len(buckets) == 2


def test_tune_that_measures_nothing_leaves_the_cache_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_tune=TUNE_TEST.replace("artifacts.update_cache", "print"))
    path = pytester.path / "cache.json"
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=cache.json")
    assert result.ret == 0, result.stdout.str()
    make_confident(path)  # a low-confidence pick (a loaded machine) is measured again, by design
    before = path.read_bytes()
    os.utime(path, ns=(0, 0))
    again = pytester.runpytest("--arbiter-tune", "--arbiter-cache=cache.json")
    assert again.ret == 0, again.stdout.str()
    again.stdout.fnmatch_lines(["*0 measured, 1 reused from cache*"])
    assert path.read_bytes() == before and path.stat().st_mtime_ns == 0


def test_tune_with_a_truncated_cache_is_a_usage_error_and_writes_nothing(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_tune=TUNE_TEST.replace("artifacts.update_cache", "print"))
    path = pytester.path / "cache.json"
    full = cache_bytes(path, cache_entry("a"), cache_entry("b"))
    path.write_bytes(full[:-30])
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=cache.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cache.json*not valid JSON*line*column*"])
    assert path.read_bytes() == full[:-30]
