"""A run reads a big corpus lazily: an entry is decoded and checked when the run first
needs it, so a damaged entry of a key the run never dispatches stops nothing (and a
tune keeps its line as it was), while one the run needs fails the dispatch, naming the
file and the entry."""

from __future__ import annotations

from pathlib import Path

import pytest

# imported before pytester's in-process runs, which drop modules they imported
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache_file import encode_document
from tests.factories import cache_entry, make_confident

pytestmark = pytest.mark.usefixtures("clean_registry")

CONFTEST = """
import pytest_arbiter

pytest_arbiter.op("lazy_twice", reference=lambda x: x * 2)


@pytest_arbiter.candidate("lazy_twice", target="cpu", name="lazy_add", tier=1)
def add(x):
    return x + x


@pytest_arbiter.candidate("lazy_twice", target="cpu", name="lazy_mul")
def mul(x):
    return x * 2
"""

TEST = """
import numpy as np
import pytest_arbiter


def test_one():
    pytest_arbiter.dispatch("lazy_twice", np.ones(SIZE))
"""


def corpus_with(pytester: pytest.Pytester, damaged: str) -> tuple[Path, bytes]:
    """c.json: the key of ``np.ones(8)`` tuned, beside 40 entries of another device;
    the line of ``damaged`` (a bucket) given an impossible confidence."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_one=TEST.replace("SIZE", "8"))
    assert pytester.runpytest("--arbiter-tune", "--arbiter-cache=c.json").ret == 0
    path = pytester.path / "c.json"
    make_confident(path)  # a clean run's one-line summary, whatever the machine's load
    (tuned,) = artifacts.read_cache(path).entries()
    others = [cache_entry(f"b{i:03d}") for i in range(40)]
    lines = encode_document([tuned, *others]).split(b"\n")
    bucket = tuned.bucket if damaged == "tuned" else damaged
    at = next(i for i, line in enumerate(lines) if f'"bucket":"{bucket}"'.encode() in line)
    lines[at] = lines[at].replace(b'"confidence":', b'"confidence":7,"_":', 1)
    path.write_bytes(b"\n".join(lines))
    return path, lines[at]


def test_a_damaged_entry_the_run_does_not_need_stops_nothing(
        pytester: pytest.Pytester) -> None:
    path, bad_line = corpus_with(pytester, "b017")
    result = pytester.runpytest("--arbiter-cache=c.json")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*41 entries read; 1 dispatch (1 won); keys: 0 measured, "
                                 "1 reused from cache*"])
    # a tune of a new key keeps every other line, the damaged one too, byte for byte
    pytester.makepyfile(test_one=TEST.replace("SIZE", "64"))
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=c.json")
    assert result.ret == 0, result.stdout.str()
    after = path.read_bytes()
    assert bad_line in after.split(b"\n")
    assert after.count(b'"op":"lazy_twice"') == 2


def test_a_damaged_entry_the_run_needs_fails_its_dispatch_naming_it(
        pytester: pytest.Pytester) -> None:
    path, _ = corpus_with(pytester, "tuned")
    before = path.read_bytes()
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=c.json")
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*c.json: Expected `float` <= 1.0 - at "
                                 "`$.entries[[]0[]].confidence`*"])
    assert path.read_bytes() == before
