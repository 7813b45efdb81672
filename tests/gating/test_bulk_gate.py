"""The gate's readers and comparison in bulk (C loops over a million keys) decide as the
key-by-key code they replaced, kept here frozen: the same counts, verdicts and orders on
random histograms (plain-tuple keys, zero and negative counts, keys twice, every
outcome), the same refusals of hostile files, and the gate's output byte for byte."""

from __future__ import annotations

import hashlib
import io
import itertools
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from pytest_arbiter.cli.main import MAX_LISTED, main
from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.gating import histogram_file
from pytest_arbiter.gating.baseline import (
    BaselineVerdict,
    Evidence,
    compare_to_baseline,
    first_keys,
    gate_fleet,
)
from pytest_arbiter.gating.histogram import (
    GATED_OUTCOMES,
    OUTCOMES,
    STALE,
    AnyCounts,
    CountColumns,
    HistogramKey,
    as_keys,
    join_keys,
    named_keys,
    split_keys,
)
from pytest_arbiter.gating.junit import FleetCounts, read_report
from tests.hostile import EVIL, HOSTILE_JSON

# -- the key-by-key code, frozen ----------------------------------------------------------


def frozen_named_keys(counts: AnyCounts) -> dict[HistogramKey, int]:
    return {k if type(k) is HistogramKey else HistogramKey._make(k): v
            for k, v in counts.items()}


def frozen_compare(run: Mapping[HistogramKey, int], baseline: Mapping[HistogramKey, int],
                   failing: tuple[str, ...]) -> BaselineVerdict:
    run, baseline = frozen_named_keys(run), frozen_named_keys(baseline)
    new = {k: v for k, v in run.items() if k.outcome in failing and v > 0 and k not in baseline}
    known = {k: v for k, v in run.items() if k.outcome in failing and v > 0 and k in baseline}
    fixed = sorted(k for k, v in baseline.items()
                   if k.outcome in failing and v > 0 and run.get(k, 0) == 0)
    return BaselineVerdict(new, known, fixed)


def frozen_fleet(run: Mapping[HistogramKey, int], baseline: Mapping[HistogramKey, int],
                 failing: tuple[str, ...], evidence: Evidence | None
                 ) -> tuple[BaselineVerdict, list[HistogramKey]]:
    verdict = frozen_compare(run, baseline, failing)
    covered = {(k.target, k.op) for k, v in frozen_named_keys(run).items() if v > 0}
    fixed = [k for k in verdict.fixed if (k.target, k.op) in covered and k.outcome != STALE
             and (evidence is None or evidence.proves_fixed(k))]
    proven = set(fixed)
    unchecked = [k for k in verdict.fixed if k not in proven]
    return BaselineVerdict(verdict.new, verdict.known, fixed), unchecked


def frozen_counts_and_expected(doc: histogram_file.HistogramDocument
                               ) -> tuple[dict[HistogramKey, int], dict[HistogramKey, int]]:
    counts: dict[HistogramKey, int] = {}
    expected: dict[HistogramKey, int] = {}
    for entry in doc.entries:
        counts[entry.key] = counts.get(entry.key, 0) + entry.count
        if entry.expected:
            expected[entry.key] = expected.get(entry.key, 0) + entry.expected
    return counts, expected


def frozen_gated(fleet: FleetCounts) -> dict[HistogramKey, int]:
    out = {}
    for key, count in fleet.counts.items():
        left = count - fleet.expected.get(key, 0)
        if left > 0:
            out[key] = left
    return out


# -- random histograms --------------------------------------------------------------------

NAMES = ("cpu", "nvidia", "m", "k", "a/b", EVIL, "c\0", "\0\1k", "m\1")
"""Names the gate's joined keys must keep apart and in order: NULs (what joins a key's
names) and U+0001 (what follows a NUL written in a name) among them."""
plain_keys = st.tuples(st.sampled_from((*NAMES[:2], NAMES[6])),
                       st.sampled_from((*NAMES[2:4], *NAMES[7:])),
                       st.sampled_from(NAMES), st.sampled_from(OUTCOMES))
keys = st.one_of(plain_keys, plain_keys.map(HistogramKey._make))
counts = st.dictionaries(keys, st.integers(-2, 4), max_size=40)
failing_sets = st.sampled_from([GATED_OUTCOMES, (*GATED_OUTCOMES, STALE), ("won",), ()])
triples = st.tuples(st.sampled_from(NAMES[:2]), st.sampled_from(NAMES[2:4]),
                    st.sampled_from(NAMES))
evidences = st.none() | st.builds(Evidence.of, st.sets(triples), st.sets(triples),
                                  st.sets(triples))
PROPERTY = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def items(mapping: Mapping[HistogramKey, int]) -> list[tuple[tuple[str, ...], int, type]]:
    """Items in order, each key's type with them: a plain tuple key compares equal."""
    return [(tuple(k), v, type(k)) for k, v in mapping.items()]


@PROPERTY
@given(run=counts, baseline=counts, failing=failing_sets, evidence=evidences)
def test_the_verdict_is_the_key_by_key_one_in_the_same_order(
        run: dict[HistogramKey, int], baseline: dict[HistogramKey, int],
        failing: tuple[str, ...], evidence: Evidence | None) -> None:
    old = frozen_compare(run, baseline, failing)
    new = compare_to_baseline(run, baseline, failing=failing)
    assert items(new.new) == items(old.new) and items(new.known) == items(old.known)
    assert new.fixed == old.fixed and {type(k) for k in new.fixed} <= {HistogramKey}
    old_verdict, old_unchecked = frozen_fleet(run, baseline, failing, evidence)
    fleet = gate_fleet(run, baseline, failing=failing, evidence=evidence)
    assert items(fleet.verdict.new) == items(old_verdict.new)
    assert items(fleet.verdict.known) == items(old_verdict.known)
    assert (fleet.fixed, fleet.unchecked) == (old_verdict.fixed, old_unchecked)
    assert items(named_keys(run)) == items(frozen_named_keys(run))
    assert named_keys(run) is not run


@PROPERTY
@given(parts=st.lists(st.tuples(counts, counts, st.booleans()), max_size=3))
def test_a_fleet_adds_up_and_gates_as_key_by_key(
        parts: list[tuple[dict[HistogramKey, int], dict[HistogramKey, int], bool]]) -> None:
    """Reports as dicts (JUnit) or as columns (histogram files), in any mix."""
    total, frozen = FleetCounts(), FleetCounts()
    held = total.counts
    adopted = False  # a histogram file's columns, taken as they are while nothing was counted
    for found, expected, as_columns in parts:
        found, expected = frozen_named_keys(found), frozen_named_keys(expected)
        adopted = adopted or (as_columns and not total.counts and not total.expected)
        if as_columns:
            total.extend(FleetCounts(counts=CountColumns.of(found),
                                     expected=CountColumns.of(expected)))
        else:
            total.extend(FleetCounts(counts=found, expected=expected))
        for key, count in found.items():
            frozen.add(key, count)
        for key, count in expected.items():
            frozen.expected[key] = frozen.expected.get(key, 0) + count
        assert total.counts is not found  # a copy: the report's own dict stays its own
    if not adopted:
        assert total.counts is held
    assert items(total.counts) == items(frozen.counts)
    assert items(total.gated()) == items(frozen_gated(frozen))
    assert dict(total.expected) == frozen.expected


rows = st.lists(plain_keys, max_size=30)


@PROPERTY
@given(rows=rows)
def test_joined_keys_sort_as_the_keys_and_split_back(
        rows: list[tuple[str, str, str, str]]) -> None:
    joined, escaped = join_keys(rows)
    assert list(split_keys(joined, escaped)) == [HistogramKey._make(r) for r in rows]
    assert escaped == any("\0" in name for row in rows for name in row)
    by_string = [row for _, row in sorted(zip(joined, rows, strict=True))]
    assert by_string == sorted(rows)
    assert len(set(joined)) == len(set(rows))


@PROPERTY
@given(run=counts, baseline=counts, failing=failing_sets, evidence=evidences)
@example(run={HistogramKey("cpu", "m", "cpu", "won"): 1,
              HistogramKey("cpu", "m", "cpu", "degraded"): 0},
         baseline={HistogramKey("cpu", "m", "\x00\x01k", "degraded"): 1},
         failing=("degraded", "rejected", "error"), evidence=None)  # a name starting NUL
def test_columns_gate_as_the_mappings_they_hold(
        run: dict[HistogramKey, int], baseline: dict[HistogramKey, int],
        failing: tuple[str, ...], evidence: Evidence | None) -> None:
    """Columns in key order (as a file holds them) give the key-by-key verdict too; a
    mapping's keys are made only when read."""
    def ordered(counts: dict[HistogramKey, int]) -> CountColumns:
        return CountColumns.of(dict(sorted(frozen_named_keys(counts).items())))

    old_verdict, old_unchecked = frozen_fleet(ordered(run).to_dict(), baseline, failing,
                                              evidence)
    fleet = gate_fleet(ordered(run), ordered(baseline), failing=failing, evidence=evidence,
                       dispatched=ordered(run))
    assert items(fleet.verdict.new) == items(old_verdict.new)
    assert items(fleet.verdict.known) == items(old_verdict.known)
    assert (fleet.fixed, fleet.unchecked) == (old_verdict.fixed, old_unchecked)
    known = fleet.verdict.known
    assert isinstance(known, CountColumns) and known.ascending()
    assert first_keys(known, 2) == sorted(old_verdict.known)[:2]
    assert all(known[key] == count for key, count in old_verdict.known.items())
    assert first_keys(known, None) == sorted(old_verdict.known)


entries = st.builds(
    lambda key, count, part: histogram_file.HistogramEntry(
        count=count, expected=count * part // 4, target=key[0], op=key[1], selected=key[2],
        outcome=key[3]),
    plain_keys, st.integers(0, 2**63 - 1), st.integers(0, 4))


@PROPERTY
@given(rows=st.lists(entries, max_size=30), ordered=st.booleans())
def test_a_document_reads_as_the_key_by_key_counts(
        rows: list[histogram_file.HistogramEntry], ordered: bool) -> None:
    """In any order, keys twice among them; from a file (its bytes) or as a document."""
    if ordered:
        rows.sort(key=lambda row: row.key)
    doc = histogram_file.HistogramDocument(entries=tuple(rows), schema="pytest-arbiter/histogram",
                                           version=1)
    got, old = histogram_file.counts_and_expected(doc), frozen_counts_and_expected(doc)
    assert [items(m) for m in got] == [items(m) for m in old]
    data = histogram_file.encode(doc)
    read = histogram_file.decode_columns(data, "h.json")
    assert [items(m) for m in read] == [items(m) for m in old]
    assert [items(dict(m.items())) for m in read] == [items(m) for m in old]


def test_keys_made_in_bulk_are_histogram_keys() -> None:
    made = list(as_keys([("cpu", "m", "k", "won"), ("cpu", "m", EVIL, "error")]))
    assert made == [HistogramKey("cpu", "m", "k", "won"), HistogramKey("cpu", "m", EVIL, "error")]
    assert {type(k) for k in made} == {HistogramKey} and made[1].selected == EVIL


@pytest.mark.parametrize("name", sorted(HOSTILE_JSON))
def test_a_hostile_histogram_is_refused_as_before_by_the_report_reader(
        tmp_path: Path, name: str) -> None:
    data, says = HOSTILE_JSON[name]
    path = tmp_path / "h.json"
    path.write_bytes(data)
    with pytest.raises(ArtifactError) as refused:
        read_report(path)
    with pytest.raises(ArtifactError) as also:
        histogram_file.read_histogram(path)
    assert str(path) in str(refused.value) and says in str(refused.value)
    assert str(refused.value) == str(also.value)


GATE_DIGESTS = {
    "gate": (1, "ddc498d70b591ecb781c2ba60cdf3b49ef4207937739fc35cf1c02c31edc0ef1"),
    "gate --stale=fail": (1, "d74921266390b79150f4deb26056d5be4a23cc4cbf26cc10440c121cf283a2eb"),
    "gate itself": (0, "838c5d24a902a9bc2c0659a66228cb5d6bff7bdcb400d29fecda277409a4c483"),
    "gate --update": (1, "9ebba40bdfe543dac15395103a8791f6b6ca8df34f73430dafa0fe7b9b613be4"),
    "baseline after --update": (
        0, "a8447b248dc7f71f72a08720a87596477e81d5b3f85172745fc7c2f509931dad"),
}
"""Exit status and output digest of each, taken from the key-by-key code, with changes
made since to counts only: a count of one says "1 dispatch", and the heading and
tallies say "1 report, 3000 testcases, 1 dispatch entry", "(1 known gated entry)", "(1
fixed entry removed)" (the key-by-key code's text with those counts written back as
"(1 dispatches", "report(s)", "testcase(s)" and "entries" gives its digests)."""


def gate_pair(tmp: Path) -> tuple[Path, Path]:
    """A run of 3,000 keys (hostile names among them, some degrading on purpose) and a
    baseline that knows most of its failing ones and some the run no longer shows."""
    names = ("k", "blas", "a/b", EVIL, "::warning::x", "é")
    run: dict[HistogramKey, int] = {}
    expected: dict[HistogramKey, int] = {}
    for i, outcome in zip(range(3000), itertools.cycle(OUTCOMES), strict=False):
        key = HistogramKey(f"t{i % 3}", f"op{i // 7 % 60}", names[i // 11 % len(names)],
                           outcome)
        run[key] = 1 + i % 5
        if i % 13 == 0:
            expected[key] = run[key] - i % 2
    base = {k: 1 for i, k in enumerate(run) if i % 17 and k.outcome != "won"}
    base.update((HistogramKey(f"t{i % 4}", f"op{i % 70}", "gone", o), 1)
                for i, o in zip(range(200), itertools.cycle(OUTCOMES), strict=False))
    paths = tmp / "run.json", tmp / "baseline.json"
    histogram_file.write_histogram(paths[0], run, expected)
    histogram_file.write_histogram(paths[1], base)
    return paths


GATE_RUNS = (("gate", ()), ("gate --stale=fail", ("--stale=fail",)), ("gate itself", ()),
             ("gate --update", ("--update",)))


def gate_outputs(tmp: Path, *flags: str) -> dict[str, tuple[int, str]]:
    """Exit status and output of each of :data:`GATE_RUNS` with ``flags``, and the
    baseline's bytes after ``--update``."""
    tmp.mkdir()
    run, baseline = gate_pair(tmp)
    seen: dict[str, tuple[int, str]] = {}
    for name, argv in GATE_RUNS:
        out = io.StringIO()
        against = run if name == "gate itself" else baseline
        code = main(["gate", "--baseline", str(against), *argv, *flags, str(run)], out=out)
        seen[name] = (code, out.getvalue().replace(str(tmp), "TMP"))
    seen["baseline after --update"] = (0, baseline.read_text(encoding="utf-8"))
    return seen


def digests(seen: Mapping[str, tuple[int, str]]) -> dict[str, tuple[int, str]]:
    return {name: (code, hashlib.sha256(text.encode()).hexdigest())
            for name, (code, text) in seen.items()}


def test_the_gate_prints_and_writes_what_the_key_by_key_gate_did(tmp_path: Path) -> None:
    seen = gate_outputs(tmp_path / "verbose", "--verbose")
    assert digests(seen) == GATE_DIGESTS
    kinds = {line.split(" ", 1)[0] for _, text in seen.values() for line in text.splitlines()}
    assert {"NEW", "known", "fixed", "unchecked", "degrade"} <= kinds


LISTED = ("known", "fixed", "unchecked")
SUMMARY_DIGESTS = {
    "gate": (1, "8ae0707164f1a1184968d9428c417b08fd9a8c215cd6325e541d4f91331ab49f"),
    "gate --stale=fail": (1, "afce0cf07af0e25c8b46f0877dcd29d19349d295aa108d6c5dc22ecf23a57577"),
    "gate itself": (0, "58e8b34f02c76819a82b7c27493ded21cd25f18344491eaa83cc743efc6ecfb6"),
    "gate --update": (1, "d47aa429fa59bd74326629f6bf9f6d672247bb462d87b379cb0cc003248072ab"),
    "baseline after --update": (
        0, "a8447b248dc7f71f72a08720a87596477e81d5b3f85172745fc7c2f509931dad"),
}
"""The same runs without ``--verbose``: each kind of :data:`LISTED` cut to its first
:data:`~pytest_arbiter.cli.main.MAX_LISTED` lines and a count."""


def summarised(text: str, rest: Mapping[str, str]) -> str:
    """``--verbose`` output as the default prints it: of each kind of :data:`LISTED`,
    the first lines, then ``KIND: +N more REST...`` where more were cut."""
    out: list[str] = []
    left: dict[str, int] = {}
    for line in text.splitlines(keepends=True):
        kind = line.split(" ", 1)[0]
        if kind in LISTED and line.split(":", 1)[0] != kind:
            left[kind] = left.get(kind, 0) + 1
            if left[kind] > MAX_LISTED:
                continue
        out.append(line)
    for kind in LISTED:
        extra = left.get(kind, 0) - MAX_LISTED
        if extra > 0:
            at = max(i for i, line in enumerate(out) if line.startswith(f"{kind} "))
            out.insert(at + 1, f"{kind}: +{extra} more {rest[kind]}; --verbose lists each\n")
    return "".join(out)


REST = {"known": "entries in the baseline (they pass)",
        "fixed": "entries no longer seen (tighten the baseline with --update)",
        "unchecked": "entries no report checked (kept in the baseline)"}


def test_the_gate_lists_the_first_known_fixed_and_unchecked_and_counts_the_rest(
        tmp_path: Path) -> None:
    """New entries in full, every other kind cut to its first lines and a count: a
    fleet's gate of half a million known entries prints a page, not a million lines."""
    full = gate_outputs(tmp_path / "verbose", "--verbose")
    seen = gate_outputs(tmp_path / "default")
    updated = {**REST, "fixed": "entries no longer seen (removed from the baseline)"}
    for name, (code, text) in seen.items():
        want = full[name][1]
        if name.startswith("gate"):
            want = summarised(want, updated if name == "gate --update" else REST)
        assert (code, text) == (full[name][0], want), name
    cut = [line for line in seen["gate"][1].splitlines() if "more" in line]
    assert [line.split(":", 1)[0] for line in cut] == ["known", "fixed", "unchecked"]
    assert digests(seen) == SUMMARY_DIGESTS
