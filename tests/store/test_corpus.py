"""The fleet corpus: the merge rule (confidence, then samples, then spread; a newer
measurement of changed code supersedes), conflicts, ``since``, diffs, and the merge's
algebra (commutative, associative, idempotent) checked with hypothesis."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from pytest_arbiter.store.cache import (
    NO_SINCE,
    CacheEntry,
    Considered,
    MeasureCache,
    RankedCandidate,
    since_for,
)
from pytest_arbiter.store.cache_file import (
    decode_document,
    encode_document,
)
from pytest_arbiter.store.corpus import (
    MERGE_RULE,
    diff,
    disagree,
    merge,
    merge_key,
    prefer,
    rank,
)
from tests.factories import T0, T1, cache_entry, ranked_entry, stats


def test_merge_prefers_confidence_then_samples_then_spread() -> None:
    strong = cache_entry(winner="a", confidence=0.999)
    weak = cache_entry(winner="b", runner_up="a", confidence=0.9, samples=200)
    assert prefer(strong, weak) is strong and prefer(weak, strong) is strong
    more = cache_entry(winner="b", runner_up="a", samples=50)
    assert prefer(cache_entry(samples=25), more) is more
    tight = cache_entry(winner="b", runner_up="a", spread=0.01)
    assert prefer(cache_entry(spread=0.2), tight) is tight
    # all evidence equal: a deterministic choice, whatever the order
    x, y = cache_entry(host="h1"), cache_entry(host="h2")
    assert prefer(x, y) is prefer(y, x)


def test_a_measurement_of_changed_code_supersedes_a_stronger_one_of_the_old() -> None:
    """The issue's stale winner: ``a`` became 50x slower (its code changed, fingerprint
    A to B). Re-measured against B with confidence 0.992, it must replace the entry
    measured against A with 0.999, in any order; before, the old one won 10 of 10."""
    old = cache_entry(winner="a", runner_up="b", confidence=0.999, samples=200,
                fingerprints={"a": "A" * 16, "b": "b" * 16}, since=T0)
    new = cache_entry(winner="b", runner_up="a", confidence=0.992, samples=9, median=1000.0,
                fingerprints={"a": "B" * 16, "b": "b" * 16}, since=T1)
    assert prefer(old, new) is new and prefer(new, old) is new
    for parts in ([old], [new]), ([new], [old]), ([old], [new], [old]):
        result = merge(*parts)
        assert result.entries[old.key] is new and result.conflicts == []
    # against the same code and environment, the stronger measurement still wins
    again = cache_entry(winner="b", runner_up="a", confidence=0.995, samples=9,
                  fingerprints={"a": "B" * 16, "b": "b" * 16}, since=T1, host="h2")
    assert prefer(new, again) is again and prefer(again, new) is again
    assert [c.other.winner for c in merge([new], [cache_entry(
        winner="a", runner_up="b", confidence=0.9999, fingerprints=new.fingerprints(),
        since=T1, host="h3")]).conflicts] == ["b"]


def test_since_carries_forward_only_what_was_measured_against_the_same_basis() -> None:
    fps = {"a": Considered("A" * 16, "timed"), "b": Considered("b" * 16, "rejected", "x")}
    env = {"numpy": "2.4.6"}
    old = CacheEntry("d", "cpu", "matmul", "k", "float32", (RankedCandidate("a", stats(1)),),
                     considered=fps, environment=env, since=T0)
    same = {"a": Considered("A" * 16, "timed"), "b": Considered("b" * 16, "timed")}
    assert since_for(old, same, env, T1) == T0  # an outcome is not the code
    assert since_for(old, {**same, "c": Considered("c" * 16, "timed")}, env, T1) == T1
    assert since_for(old, {"a": same["a"]}, env, T1) == T1  # a candidate removed
    assert since_for(old, {**same, "a": Considered("Z" * 16, "timed")}, env, T1) == T1
    assert since_for(old, same, {"numpy": "2.5.0"}, T1) == T1
    assert since_for(None, same, env, T1) == T1
    legacy = CacheEntry("d", "cpu", "matmul", "k", "float32", (RankedCandidate("a", stats(1)),),
                        considered=fps, environment=env)
    assert since_for(legacy, same, env, T1) == T1


def test_merge_reports_true_conflicts_only() -> None:
    a = cache_entry(winner="a", runner_up="b", host="h1")
    b = cache_entry(winner="b", runner_up="a", host="h2", samples=50)
    unsure = cache_entry(winner="c", runner_up="a", host="h3", confidence=0.6)
    tied = cache_entry(winner="d", runner_up="a", host="h4", tie=True, confidence=0.995)
    result = merge([a], [b], [unsure], [tied])
    assert result.entries[a.key] is b
    assert [(c.kept.winner, c.other.winner) for c in result.conflicts] == [("b", "a")]
    assert "kept b (host h2" in result.conflicts[0].describe()
    assert merge([a], [a]).conflicts == [] and merge([a], [unsure]).conflicts == []
    backwards = merge([tied], [unsure], [b], [a])
    assert backwards.conflicts == result.conflicts
    # different winners measured against different code: a change, not a conflict
    changed = cache_entry(winner="b", runner_up="a", fingerprints={"a": "2" * 16}, since=T1)
    assert merge([a], [changed]).conflicts == []


def test_diff_reports_changed_winners_and_by_how_much() -> None:
    old = [cache_entry("x", "a"), cache_entry("gone")]
    new_x = CacheEntry("dev0", "cpu", "matmul", "x", "float32",
                       (RankedCandidate("b", stats(800.0)), RankedCandidate("a", stats(1200.0))))
    d = diff(old, [new_x, cache_entry("new")])
    assert [(c.old.winner, c.new.winner) for c in d.changed] == [("a", "b")]
    change = d.changed[0]
    assert change.change == pytest.approx(-0.2) and change.margin == pytest.approx(0.5)
    assert [e.bucket for e in d.added] == ["new"] and [e.bucket for e in d.removed] == ["gone"]


NAMES = ("a", "b", "c")


entries_st = st.builds(
    lambda bucket, names, samples, spread, conf, tie, host, code, since: cache_entry(
        bucket, names[0], confidence=conf, samples=samples, spread=spread, tie=tie,
        host=host, runner_up=names[1] if len(names) > 1 else None,
        fingerprints={n: code * 16 for n in names} if code else None, since=since,
        environment={"numpy": "2"} if code == "1" else None),
    st.sampled_from(("b1", "b2", "b3")),
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True),
    st.sampled_from((1, 25)), st.sampled_from((0.0, 0.1)),
    st.sampled_from((0.5, 0.99, 1.0)), st.booleans(), st.sampled_from(("h1", "h2")),
    st.sampled_from(("", "1", "2")), st.sampled_from((NO_SINCE, T0, T1)))


caches_st = st.lists(entries_st, max_size=6).map(lambda es: merge(es).entries)


def _same(x: dict[tuple[str, ...], CacheEntry], y: dict[tuple[str, ...], CacheEntry]) -> None:
    assert x == y
    assert encode_document(x.values()) == encode_document(y.values())


@settings(max_examples=150, deadline=None)
@given(caches_st, caches_st, caches_st)
@pytest.mark.slow
def test_merge_is_commutative_associative_idempotent(a: dict, b: dict, c: dict) -> None:  # type: ignore[type-arg]
    """With entries measured against different fingerprints, environments and since."""
    ab = merge(a, b)
    _same(ab.entries, merge(b, a).entries)
    assert ab.conflicts == merge(b, a).conflicts
    _same(merge(ab.entries, c).entries, merge(a, merge(b, c).entries).entries)
    _same(merge(a, a).entries, a)
    _same(merge(a).entries, a)


def _loaded(entries: dict) -> MeasureCache:  # type: ignore[type-arg]
    """The cache as read back from its file."""
    return MeasureCache(decode_document(encode_document(entries.values())))


@settings(max_examples=100, deadline=None)
@given(caches_st, caches_st, caches_st)
def test_merging_caches_and_loaded_caches_is_the_same_merge(a: dict, b: dict, c: dict  # type: ignore[type-arg]
                                                            ) -> None:
    want = merge(a, b, c)
    for parts in ((MeasureCache(a.values()), MeasureCache(b.values()), MeasureCache(c.values())),
                  (_loaded(a), _loaded(b), _loaded(c)), (a, _loaded(b), MeasureCache(c.values()))):
        got = merge(*parts)
        _same(got.entries, want.entries)
        assert got.conflicts == want.conflicts


def test_a_stale_entry_replaced_by_a_later_measurement_is_not_a_conflict() -> None:
    code = {"a": "A" * 16, "b": "B" * 16}
    old = cache_entry(winner="a", runner_up="b", fingerprints=code, since=T0)
    rechecked = cache_entry(winner="b", runner_up="a", fingerprints=code, since=T1, host="h2")
    result = merge([old], [rechecked])
    assert result.entries[old.key] is rechecked and result.conflicts == []
    same_time = cache_entry(winner="b", runner_up="a", fingerprints=code, since=T0, host="h2")
    assert len(merge([old], [same_time]).conflicts) == 1  # the same code, at one time


SOFTMAX = ("numba_softmax", "inplace_softmax", "blocked_softmax")
CODE = {name: name[:2] * 8 for name in SOFTMAX}


def softmax_entry(host: str, confidence: float, *ranked: str,
                  outcomes: dict[str, str] | None = None) -> CacheEntry:
    """One key of a runner's shard: ``ranked`` timed fastest first, the other
    candidates of :data:`SOFTMAX` recorded with ``outcomes`` (the same code everywhere)."""
    rows = {name: Considered(CODE[name], "timed") for name in ranked}
    for name, outcome in (outcomes or {}).items():
        rows[name] = Considered(CODE[name], outcome, f"{outcome} on {host}")  # type: ignore[arg-type]
    return ranked_entry("8x64", *ranked, medians=(1000.0, 1100.0, 1500.0)[:len(ranked)],
                        op="softmax", dtype="float32", confidence=confidence, host=host,
                        considered=rows)


@pytest.mark.parametrize("outcome", ["unavailable", "declined", "accepts_declined"])
def test_a_winner_the_other_runner_could_not_time_is_not_a_conflict(outcome: str) -> None:
    """The issue: runner A timed numba_softmax and it won; on runner B it could not run
    (its row says why), so B picked inplace_softmax from what it could time. Same code,
    same since, two clear picks: before, a conflict; B never compared the two."""
    a = softmax_entry("runner-a", 0.999, *SOFTMAX)
    b = softmax_entry("runner-b", 0.9992, "inplace_softmax", "blocked_softmax",
                      outcomes={"numba_softmax": outcome})
    assert a.same_basis(b) and a.since == b.since and a.confident and b.confident
    assert not disagree(a, b) and not disagree(b, a)
    for parts in ([a], [b]), ([b], [a]), ([a], [b], [a]):
        result = merge(*parts)
        # the rule keeps the entry that timed more of the key's candidates (rule 2)
        assert result.entries[a.key] is a and result.conflicts == []
    assert merge_key(tuple(a.key), [b, a]) == (a, [])


def test_clear_picks_that_timed_both_winners_are_still_a_conflict() -> None:
    a = softmax_entry("runner-a", 0.999, *SOFTMAX)
    c = softmax_entry("runner-c", 0.9995, "inplace_softmax", "numba_softmax", "blocked_softmax")
    assert disagree(a, c) and disagree(c, a)
    for parts in ([a], [c]), ([c], [a]):
        result = merge(*parts)
        assert result.entries[a.key] is c  # the same candidates timed: confidence decides
        assert [(x.kept.winner, x.other.winner) for x in result.conflicts] == [
            ("inplace_softmax", "numba_softmax")]
    # each entry timed the other's winner, though not the same set: still a conflict
    d = softmax_entry("runner-d", 0.9995, "inplace_softmax", "numba_softmax",
                      outcomes={"blocked_softmax": "unavailable"})
    assert disagree(a, d) and len(merge([a], [d]).conflicts) == 1


def test_the_merge_rule_in_words_has_a_criterion_for_each_thing_compared() -> None:
    """``MERGE_RULE`` (what ``merge --help`` says) names each field :func:`rank`
    compares, in its order, then the canonical JSON."""
    assert len(MERGE_RULE) == len(rank(cache_entry())) + 1
    assert [MERGE_RULE[0].split()[2], MERGE_RULE[1], MERGE_RULE[-1]] == [
        "since", "more of the key's candidates timed", "the smaller canonical JSON"]


def test_the_merge_rule_worked_out_field_by_field_is_the_rank_comparison() -> None:
    """Entries alike but for each of the rule's fields in turn (and ties of all of
    them): the pick that works a field out only when the ones before are equal is the
    pick by the whole rank."""
    import datetime
    import itertools

    from pytest_arbiter.store.corpus import _pick, _pick_of, rank

    sinces = [T0, T0 + datetime.timedelta(hours=1)]
    variants = [cache_entry("b", winner, since=since, confidence=confidence,
                            samples=samples, spread=spread, runner_up=runner,
                            fingerprints=fingerprints)
                for since, confidence, samples, spread, runner, fingerprints, winner in
                itertools.product(sinces, (0.9, 0.999), (20, 30), (0.1, 0.2),
                                  ("b", None), ({"a": "0" * 16}, {}), ("a", "c"))]
    for a, b in itertools.product(variants, repeat=2):
        if a is not b:
            assert _pick_of(a, b) is _pick(a, b, rank(a), rank(b))
