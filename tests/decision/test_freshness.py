"""Entries that know what they were measured against: the candidates considered with
their code's fingerprints, the environment, and what a run does when those changed
(docs/artifacts.md, "When an entry is out of date").

Unit tests drive :class:`Arbiter` and :func:`measured_arbitrate` directly; the last
tests run the plugin in a real pytest project.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest

from pytest_arbiter import Arbiter, ComparePolicy, MeasureCache
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.ops import OPS
from pytest_arbiter.decision.tuning import measured_arbitrate
from pytest_arbiter.errors import Decline, StaleEntry
from pytest_arbiter.extend.fingerprint import current_environment, fingerprint_of
from pytest_arbiter.store.cache import CacheEntry
from pytest_arbiter.store.cache_file import convert_document, document_builtins
from pytest_arbiter.store.corpus import merge
from tests.factories import FAST, fn, library, make_confident, mats, registry_of


def fourfold(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The same product, computed four times: real work, clearly slower."""
    out = np.matmul(a, b)
    for _ in range(3):
        out = np.matmul(a, b)
    return out


def tenfold(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.matmul(a, b)
    for _ in range(9):
        out = np.matmul(a, b)
    return out


def zeros(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.zeros((a.shape[0], b.shape[1]), dtype=a.dtype)


def never(a: np.ndarray, b: np.ndarray) -> bool:
    return False


def tuned(*cands: FunctionCandidate, cache: MeasureCache | None = None) -> Arbiter:
    arb = Arbiter(registry=registry_of(*cands), cache=cache, mode="tune", policy=FAST)
    arb.dispatch("matmul", *mats(32))
    return arb


def only_entry(cache: MeasureCache) -> CacheEntry:
    (entry,) = cache.entries()
    return entry


def test_an_entry_records_every_candidate_considered_and_the_environment() -> None:
    cands = (fn(library, "library"), fn(tenfold, "tenfold"), fn(zeros, "zeros"),
             fn(library, "picky", accepts=never))
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    entry = only_entry(tuned(*cands).cache)
    assert {name: seen.outcome for name, seen in entry.considered.items()} == {
        "library": "timed", "tenfold": "timed", "zeros": "rejected", "picky": "accepts_declined"}
    assert entry.fingerprints() == {c.name: fingerprint_of(c) for c in cands}
    assert "all zeros" in entry.considered["zeros"].reason
    assert "accepts() returned False" in entry.considered["picky"].reason
    assert dict(entry.environment) == current_environment("cpu")
    assert entry.environment["numpy"] == np.__version__
    assert entry.since >= before
    assert not entry.reverify
    # and all of it survives the file
    again = convert_document(json.loads(json.dumps(document_builtins([entry]))))
    assert again == [entry]


def test_a_candidate_added_later_is_timed_against_the_cached_leader() -> None:
    first = tuned(fn(fourfold, "fourfold"), fn(tenfold, "tenfold"))
    old = only_entry(first.cache)
    assert old.winner == "fourfold"
    now = registry_of(fn(fourfold, "fourfold"), fn(tenfold, "tenfold"), fn(library, "library"))
    selection = measured_arbitrate(OPS.get("matmul"), mats(32), now.for_op("matmul", "cpu"),
                                   first.cache, policy=FAST)
    assert selection.source == "measured"
    assert selection.comparison is not None
    # what is new, against the leader and the runner-up, side by side
    assert set(selection.comparison.stats) == {"fourfold", "library", "tenfold"}
    new = only_entry(first.cache)
    assert new.winner == "library"
    assert [r.name for r in new.ranking] == ["library", "fourfold", "tenfold"]
    assert not any(r.carried for r in new.ranking)
    assert set(new.considered) == {"fourfold", "tenfold", "library"}
    assert new.since > old.since  # measured against more candidates: a new basis
    # measured against the newer set of candidates: it wins the merge, whatever the
    # confidence of the old one
    weaker = msgspec.structs.replace(new, confidence=0.5)
    assert merge([old], [weaker]).entries[old.key] == weaker
    assert merge([weaker], [old]).entries[old.key] == weaker


def test_a_plain_run_lists_a_key_with_candidates_never_measured_and_strict_fails() -> None:
    cache = tuned(fn(fourfold, "fourfold"), fn(tenfold, "tenfold")).cache
    now = (fn(fourfold, "fourfold"), fn(tenfold, "tenfold"), fn(library, "library", tier=9))
    plain = Arbiter(registry=registry_of(*now), cache=cache, mode="static")
    plain.dispatch("matmul", *mats(32))
    (event,) = plain.events.values()
    assert event.stale == {"unmeasured": "never measured: library"}
    # the cached ranking still decides: the leader runs, not the high-tier newcomer
    assert plain.histogram.counts() == {("cpu", "matmul", "fourfold", "won"): 1}
    strict = Arbiter(registry=registry_of(*now), cache=cache, mode="strict")
    with pytest.raises(StaleEntry, match="never measured: library; tune with --arbiter-tune"):
        strict.dispatch("matmul", *mats(32))


def test_changed_code_is_timed_again_and_its_old_timing_dropped() -> None:
    first = tuned(fn(library, "library"), fn(fourfold, "slow"), fn(tenfold, "slower"))
    old = only_entry(first.cache)
    assert [r.name for r in old.ranking] == ["library", "slow", "slower"]
    # "slower" was edited into something faster than "slow"
    now = registry_of(fn(library, "library"), fn(fourfold, "slow"), fn(library, "slower"))
    plain = Arbiter(registry=now, cache=first.cache, mode="static")
    plain.dispatch("matmul", *mats(32))
    assert next(iter(plain.events.values())).stale == {
        "unmeasured": "code changed since measured: slower"}
    selection = measured_arbitrate(OPS.get("matmul"), mats(32), now.for_op("matmul", "cpu"),
                                   first.cache, policy=FAST)
    assert selection.comparison is not None
    assert set(selection.comparison.stats) == {"library", "slow", "slower"}
    new = only_entry(first.cache)
    assert new.considered["slower"].fingerprint == fingerprint_of(now.get("slower"))
    assert new.considered["slower"].fingerprint != old.considered["slower"].fingerprint
    slower = next(r for r in new.ranking if r.name == "slower")
    assert slower != old.ranking[2]  # the old code's timing is gone
    assert slower.stats.median_ns < next(
        r for r in new.ranking if r.name == "slow").stats.median_ns


def test_a_changed_winner_is_not_used_and_the_next_tune_measures_the_key_again() -> None:
    first = tuned(fn(library, "fast"), fn(tenfold, "slow"))
    assert only_entry(first.cache).winner == "fast"
    now = (fn(tenfold, "fast"), fn(tenfold, "slow", tier=1))  # the winner became slow
    plain = Arbiter(registry=registry_of(*now), cache=first.cache, mode="static")
    plain.dispatch("matmul", *mats(32))
    (event,) = plain.events.values()
    assert "winner-changed" in event.stale
    assert event.source == "static"
    assert plain.histogram.counts() == {("cpu", "matmul", "slow", "won"): 1}  # tier order
    with pytest.raises(StaleEntry, match="the cached winner fast changed code"):
        Arbiter(registry=registry_of(*now), cache=first.cache,
                mode="strict").dispatch("matmul", *mats(32))
    retune = tuned(*now, cache=first.cache)
    (event,) = retune.events.values()
    assert event.source == "measured"
    assert not event.stale
    entry = only_entry(first.cache)
    assert entry.fingerprints() == {c.name: fingerprint_of(c) for c in now}


def test_a_new_environment_keeps_the_ranking_and_re_times_winner_against_runner_up() -> None:
    first = tuned(fn(library, "library"), fn(fourfold, "fourfold"), fn(tenfold, "tenfold"))
    old = only_entry(first.cache)
    env = {**current_environment("cpu"), "numpy": "1.0.0"}
    first.cache.put(msgspec.structs.replace(old, environment=env))
    cands = registry_of(fn(library, "library"), fn(fourfold, "fourfold"), fn(tenfold, "tenfold"))
    plain = Arbiter(registry=cands, cache=first.cache, mode="static")
    plain.dispatch("matmul", *mats(32))
    (event,) = plain.events.values()
    assert event.stale == {"reverify": "measured under another environment: "
                                       f"numpy 1.0.0 -> {np.__version__}"}
    assert plain.histogram.counts() == {("cpu", "matmul", "library", "won"): 1}
    strict = Arbiter(registry=cands, cache=first.cache, mode="strict")
    strict.dispatch("matmul", *mats(32))  # the ranking is kept: not a strict failure
    selection = measured_arbitrate(OPS.get("matmul"), mats(32), cands.for_op("matmul", "cpu"),
                                   first.cache, policy=FAST)
    assert selection.comparison is not None
    assert set(selection.comparison.stats) == {"library", "fourfold"}
    new = only_entry(first.cache)
    assert dict(new.environment) == current_environment("cpu")
    assert [r.name for r in new.ranking] == ["library", "fourfold", "tenfold"]
    assert new.ranking[2].carried and new.ranking[2].stats == old.ranking[2].stats


def test_an_entry_marked_for_reverification_is_re_timed_by_the_next_tune() -> None:
    first = tuned(fn(library, "library"), fn(tenfold, "tenfold"))
    first.cache.put(msgspec.structs.replace(only_entry(first.cache), reverify=True))
    cands = registry_of(fn(library, "library"), fn(tenfold, "tenfold"))
    plain = Arbiter(registry=cands, cache=first.cache, mode="static")
    plain.dispatch("matmul", *mats(32))
    assert next(iter(plain.events.values())).stale == {
        "reverify": "measured under another environment: marked for re-verification"}
    measured_arbitrate(OPS.get("matmul"), mats(32), cands.for_op("matmul", "cpu"),
                       first.cache, policy=FAST)
    assert not only_entry(first.cache).reverify


# -- the plugin ------------------------------------------------------------------------

CONFTEST = '''
import os
import numpy as np
import pytest_arbiter


def fourfold(a, b):
    out = a @ b
    for _ in range(3):
        out = a @ b
    return out


pytest_arbiter.candidate("matmul", target="cpu", name="fourfold")(fourfold)
if os.environ.get("WITH_NEW"):
    @pytest_arbiter.candidate("matmul", target="cpu", name="newcomer", tier=5)
    def newcomer(a, b):
        return np.matmul(a, b)
'''

TEST = '''
import numpy as np
import pytest_arbiter


def test_product():
    a = np.ones((24, 24), np.float32)
    assert (pytest_arbiter.dispatch("matmul", a, a) == 24).all()
'''


@pytest.mark.slow
def test_the_summary_lists_stale_keys_strict_fails_on_them_and_tune_clears_them(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_product=TEST)
    run = ["-p", "no:cacheprovider", "--arbiter-cache=corpus.json"]
    assert pytester.runpytest_subprocess(*run, "--arbiter-tune").ret == 0
    corpus = json.loads((pytester.path / "corpus.json").read_text())
    assert corpus["version"] == 3
    monkeypatch.setenv("WITH_NEW", "1")
    plain = pytester.runpytest_subprocess(*run)
    assert plain.ret == 0
    plain.stdout.fnmatch_lines([
        "*1 key with candidates that were never measured, or whose code changed since*",
        "*cpu/matmul/*: never measured: newcomer*",
    ])
    strict = pytester.runpytest_subprocess(*run, "--arbiter-strict")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["*StaleEntry*never measured: newcomer*"])
    tune = pytester.runpytest_subprocess(*run, "--arbiter-tune")
    assert tune.ret == 0
    make_confident(pytester.path / "corpus.json")  # strict fails a loaded machine's pick
    again = pytester.runpytest_subprocess(*run, "--arbiter-strict")
    again.assert_outcomes(passed=1)
    assert "never measured" not in again.stdout.str()


# -- a recheck's re-measurement -----------------------------------------------------------

SLOW = {"alpha": False, "beta": False}


def alpha(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # a switch outside the code stands in for a driver update that slowed this kernel:
    # its fingerprint does not change
    return tenfold(a, b) if SLOW["alpha"] else np.matmul(a, b)


def test_a_stale_winner_re_measured_under_tune_supersedes_the_stronger_old_entry() -> None:
    from pytest_arbiter.store.corpus import prefer
    from pytest_arbiter.timing.recheck import RecheckPolicy

    cands = registry_of(fn(alpha, "alpha"), fn(fourfold, "beta"))
    strong = ComparePolicy(min_rounds=30, max_rounds=60, budget_s=0.5)
    first = Arbiter(registry=cands, mode="tune", policy=strong)
    first.dispatch("matmul", *mats(32))
    old = only_entry(first.cache)
    assert old.winner == "alpha"
    SLOW["alpha"] = True
    try:
        cache = MeasureCache(first.cache.entries())
        retune = Arbiter(registry=cands, cache=cache, mode="tune", policy=FAST,
                         recheck=RecheckPolicy(key_budget_s=0.2))
        retune.dispatch("matmul", *mats(32))
    finally:
        SLOW["alpha"] = False
    (found,) = retune.rechecks.values()
    assert found is not None and found.stale and found.faster == "beta"
    new = only_entry(cache)
    assert new.winner == "beta"
    assert new.samples < old.samples  # the weaker measurement ...
    assert prefer(old, new) is new and prefer(new, old) is new  # ... replaces the old one
    assert retune.histogram.counts()[("cpu", "matmul", "alpha", "stale")] == 1


def beta(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if SLOW["beta"]:  # twice tenfold's work: slower than gamma
        tenfold(a, b)
        return tenfold(a, b)
    return fourfold(a, b)


def test_a_recheck_leaves_a_winner_that_cannot_run_here_alone() -> None:
    """A winner unavailable on this runner is not re-timed: the runner-up, slowed, is
    not re-timed against the third and called "the cached winner", stale, so the
    entry is neither superseded nor its winner demoted."""
    from pytest_arbiter.timing.recheck import RecheckPolicy

    first = tuned(fn(alpha, "alpha"), fn(beta, "beta"), fn(tenfold, "gamma"))
    old = only_entry(first.cache)
    assert [r.name for r in old.ranking] == ["alpha", "beta", "gamma"]
    gone = FunctionCandidate(alpha, "alpha", "matmul", "cpu", 0, None, lambda: False)
    cache = MeasureCache(first.cache.entries())
    SLOW["beta"] = True
    try:
        here = Arbiter(registry=registry_of(gone, fn(beta, "beta"), fn(tenfold, "gamma")),
                       cache=cache, mode="tune", policy=FAST,
                       recheck=RecheckPolicy(key_budget_s=0.2))
        here.dispatch("matmul", *mats(32))
    finally:
        SLOW["beta"] = False
    assert not any(here.rechecks.values())
    assert not any(key[3] == "stale" for key in here.histogram.counts())
    assert only_entry(cache).ranking == old.ranking


def test_a_candidate_that_declines_when_run_is_measured_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """It declines in the gate: recorded as declined, not measured again on every plan
    (two keys bump the cache in turn), and strict replays the tuned corpus."""
    from pytest_arbiter.decision import tuning as arbiter_module

    def work_stealing(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        raise Decline("no work to steal")

    comparisons = []
    real = arbiter_module.compare_latencies

    def counted(*args: Any, **kwargs: Any) -> Any:
        comparisons.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(arbiter_module, "compare_latencies", counted)
    cands = (fn(library, "library"), fn(fourfold, "fourfold"), fn(work_stealing, "ws"))
    arb = Arbiter(registry=registry_of(*cands), mode="tune", policy=FAST)
    for _ in range(5):
        for n in (32, 64):
            arb.dispatch("matmul", *mats(n))
    assert len(comparisons) == 2
    for entry in arb.cache.entries():
        assert entry.considered["ws"].outcome == "declined"
    strict = Arbiter(registry=registry_of(*cands), cache=arb.cache, mode="strict")
    for n in (32, 64):
        strict.dispatch("matmul", *mats(n))
    assert not any(e.stale for e in strict.events.values())


def twofold(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    np.matmul(a, b)
    return np.matmul(a, b)


def threefold(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    np.matmul(a, b)
    np.matmul(a, b)
    return np.matmul(a, b)


@pytest.mark.timing
def test_a_row_not_timed_in_the_latest_comparison_is_carried_after_every_timed_row() -> None:
    """The key was tuned on a smaller shape of its bucket; a candidate added since is
    timed with the leader and the runner-up on a larger one: the third row's old
    (smaller-shape) median places it nowhere: it is carried, after the slower newcomer."""
    first = Arbiter(registry=registry_of(fn(library, "fast"), fn(twofold, "twofold"),
                                         fn(threefold, "threefold")), mode="tune", policy=FAST)
    first.dispatch("matmul", *mats(96))
    old = only_entry(first.cache)
    assert [r.name for r in old.ranking] == ["fast", "twofold", "threefold"]
    now = registry_of(fn(library, "fast"), fn(twofold, "twofold"), fn(threefold, "threefold"),
                      fn(tenfold, "tenfold"))
    selection = measured_arbitrate(OPS.get("matmul"), mats(128), now.for_op("matmul", "cpu"),
                                   first.cache, policy=FAST)
    assert selection.comparison is not None
    assert set(selection.comparison.stats) == {"fast", "twofold", "tenfold"}
    new = only_entry(first.cache)
    assert new.key == old.key  # one bucket, two shapes
    assert [(r.name, r.carried) for r in new.ranking] == [
        ("fast", False), ("twofold", False), ("tenfold", False), ("threefold", True)]
    assert new.ranking[3].stats == old.ranking[2].stats  # its data is kept


# -- a user op's kernel that declined the only inputs it was tried on ------------------

def _user_op(*cands: tuple[Callable[..., Any], str, int]) -> tuple[CandidateRegistry, Any]:
    from pytest_arbiter.core.ops import OpRegistry, make_op

    ops = OpRegistry()
    ops.register(make_op("fr_mm", lambda a, b: np.matmul(a, b, dtype=np.float64)))
    reg = CandidateRegistry()
    reg.extend(FunctionCandidate(kernel, name, "fr_mm", "cpu", tier, None, None)
               for kernel, name, tier in cands)
    return reg, ops


def _row_major_only(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if not a.flags.c_contiguous:
        raise Decline("needs a row-major A")
    return np.matmul(a, b)


def _rowwise(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.stack([row @ b for row in a])


def test_a_kernel_declining_again_writes_nothing_even_beside_a_broken_candidate() -> None:
    """Tuning dispatches of new signatures try the kernel that declined again; when it
    declines again the entry stands: no write, so the process keeps its plans (another
    candidate's broken accepts() does not change that)."""
    def broken_accepts(a: np.ndarray, b: np.ndarray) -> bool:
        raise RuntimeError("accepts() is broken")

    reg, ops = _user_op((_row_major_only, "fr_rowmajor", 9), (_rowwise, "fr_rowwise", 1))
    reg.add(FunctionCandidate(np.matmul, "fr_broken", "fr_mm", "cpu", 0, broken_accepts,
                              None))
    arb = Arbiter(registry=reg, ops=ops, mode="tune", policy=FAST)
    a, b = mats(32)
    # two column-major layouts of one key: contiguous, and every other row of a taller one
    first = np.asfortranarray(a)
    second = np.asfortranarray(np.concatenate([a, a]))[::2]
    arb.dispatch("fr_mm", first, b)
    arb.dispatch("fr_mm", second, b)
    assert len(arb.cache) == 1
    version = arb.cache.version
    for i in range(20):
        arb.dispatch("fr_mm", first if i % 2 else second, b)
    assert arb.cache.version == version


def test_a_kernel_tried_again_is_placed_against_a_candidate_timed_before() -> None:
    """The cached leader declines the new inputs: the kernel tried again is timed against
    the next cached candidate that runs them, never alone and put first."""
    import time

    def slow_row_major(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if not a.flags.c_contiguous:
            raise Decline("needs a row-major A")
        time.sleep(0.002)
        return np.matmul(a, b)

    def column_major_only(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if not a.flags.f_contiguous:
            raise Decline("needs a column-major A")
        return np.matmul(a, b)

    def any_layout(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        time.sleep(0.0003)
        return np.matmul(a, b)

    reg, ops = _user_op((slow_row_major, "fr_x", 9), (column_major_only, "fr_l", 5),
                        (any_layout, "fr_m", 1))
    cache = MeasureCache()
    a, b = mats(32)
    Arbiter(registry=reg, ops=ops, cache=cache, mode="tune", policy=FAST).dispatch(
        "fr_mm", np.asfortranarray(a), b)
    arb = Arbiter(registry=reg, ops=ops, cache=cache, mode="tune", policy=FAST)
    for _ in range(3):
        arb.dispatch("fr_mm", a, b)
    assert arb.histogram.counts() == {("cpu", "fr_mm", "fr_m", "won"): 3}
    (entry,) = cache.entries()
    names = [r.name for r in entry.ranking]
    assert names.index("fr_m") < names.index("fr_x"), names


def test_timing_a_kernel_that_had_declined_wins_the_merge_on_the_same_basis() -> None:
    """Its first timing keeps the entry's since (the same code and environment) and
    wins the merge because it timed more of the key's candidates; two runners that time
    it compete on their evidence, not on their clocks."""
    from pytest_arbiter.store.cache import Considered, since_for
    from pytest_arbiter.store.corpus import prefer

    reg, ops = _user_op((_row_major_only, "fr_rowmajor", 9), (_rowwise, "fr_rowwise", 1))
    arb = Arbiter(registry=reg, ops=ops, mode="tune", policy=FAST)
    a, b = mats(32)
    arb.dispatch("fr_mm", np.asfortranarray(a), b)
    (old,) = arb.cache.entries()
    assert old.considered["fr_rowmajor"].outcome == "inputs_declined"
    timed = {name: Considered(row.fingerprint, "timed") for name, row in
             old.considered.items()}
    later = datetime.datetime(2999, 1, 1, tzinfo=datetime.timezone.utc)
    assert since_for(old, timed, dict(old.environment), later) == old.since
    arb.dispatch("fr_mm", a, b)
    (new,) = arb.cache.entries()
    assert new.since == old.since and new.considered["fr_rowmajor"].outcome == "timed"
    assert prefer(old, new) is new and prefer(new, old) is new
