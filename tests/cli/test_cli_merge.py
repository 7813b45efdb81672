"""``pytest-arbiter merge`` on real shards: what it calls a conflict, and what its help
and ``gate``'s say the rules are."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pytest_arbiter.cli.main import main
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, Considered, MeasureCache
from pytest_arbiter.store.corpus import MERGE_RULE
from tests.factories import ranked_entry

SOFTMAX = ("numba_softmax", "inplace_softmax", "blocked_softmax")
KEY = "sm_90/nvidia/softmax/8x64/float32"


def shard(path: Path, host: str, confidence: float, *ranked: str,
          unavailable: tuple[str, ...] = ()) -> Path:
    """A runner's shard of one key: ``ranked`` timed fastest first, ``unavailable``
    recorded as such; every candidate's code the same on every runner."""
    rows = {name: Considered(name[:2] * 8, "timed") for name in ranked}
    rows.update({name: Considered(name[:2] * 8, "unavailable", "numba is not installed")
                 for name in unavailable})
    entry = ranked_entry("8x64", *ranked, medians=(1000.0, 1100.0, 1500.0)[:len(ranked)],
                         op="softmax", dtype="float32", confidence=confidence, host=host,
                         considered=rows)
    artifacts.write_cache(path, MeasureCache([entry]))
    return path


def merge(*argv: str | Path) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["merge", "--fail-on-conflict", *map(str, argv)], out=out)
    return code, out.getvalue()


def kept(path: Path) -> CacheEntry:
    (entry,) = artifacts.read_cache(path).entries()
    return entry


def test_a_candidate_unavailable_on_one_runner_is_no_conflict(tmp_path: Path) -> None:
    """The issue: runner A timed numba_softmax and it won; on runner B it is unavailable,
    and inplace_softmax won what B could time. B never compared the two: no conflict
    (before: one, and exit 1). A's entry timed more of the key's candidates: kept."""
    a = shard(tmp_path / "A2.json", "runner-a", 0.999, *SOFTMAX)
    b = shard(tmp_path / "B3.json", "runner-b", 0.9992, "inplace_softmax", "blocked_softmax",
              unavailable=("numba_softmax",))
    for order in ((a, b), (b, a)):
        corpus = tmp_path / f"corpus-{order[0].stem}.json"
        code, text = merge("-o", corpus, *order)
        assert code == 0, text
        assert "conflict" not in text.replace("0 conflict(s)", "")
        assert text.endswith("1 entries after merging 2 shard(s); 0 conflict(s)\n")
        entry = kept(corpus)
        assert (entry.winner, entry.provenance.host) == ("numba_softmax", "runner-a")


def test_clear_picks_of_the_same_candidates_that_disagree_are_a_conflict(
        tmp_path: Path) -> None:
    a = shard(tmp_path / "A2.json", "runner-a", 0.999, *SOFTMAX)
    c = shard(tmp_path / "C4.json", "runner-c", 0.9995, "inplace_softmax", "numba_softmax",
              "blocked_softmax")
    code, text = merge("-o", tmp_path / "corpus.json", a, c)
    assert code == 1
    assert (f"conflict {KEY}: kept inplace_softmax (host runner-c, confidence 0.9995"
            in text)
    assert "over numba_softmax (host runner-a, confidence 0.999," in text
    assert text.endswith("1 entries after merging 2 shard(s); 1 conflict(s)\n")


def help_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What ``--help`` prints, on one line (any terminal width)."""
    assert main([*argv, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())


def test_merge_help_states_the_rule_in_its_order(capsys: pytest.CaptureFixture[str]
                                                 ) -> None:
    text = help_text(capsys, "merge")
    assert "the one with " + ", then ".join(MERGE_RULE) + "." in text
    assert ("then more of the key's candidates timed, then the higher confidence"
            in text)
    assert "each winner timed in the other's comparison" in text


def test_gate_help_names_every_outcome_it_fails_on(capsys: pytest.CaptureFixture[str]
                                                   ) -> None:
    assert "fail (exit 1) on a degraded, rejected or error entry the baseline does not " \
        "list" in help_text(capsys, "gate")
    assert "fail on new degraded, rejected or error dispatches" in help_text(capsys)
