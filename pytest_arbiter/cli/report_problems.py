"""The problem table of ``pytest-arbiter report``: every degraded, rejected, error,
no_candidate and stale entry of the runs' histograms and JUnit reports, and every
kernel the corpus records as failing when its key was measured, each with its reasons
(from the corpus), the tests behind it (from JUnit reports) and the cache keys it
concerns (links to their rows on the page)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pytest_arbiter.cli.report_cells import StaleKey, breakable, breakable_id, text
from pytest_arbiter.gating.baseline import GATE_REMEDY
from pytest_arbiter.gating.histogram import HistogramKey
from pytest_arbiter.gating.junit import FleetCounts
from pytest_arbiter.store.cache import CacheEntry, CacheKey, Considered

PROBLEM_OUTCOMES = ("degraded", "rejected", "error", "no_candidate", "stale")
"""The table's order: what the gate fails on first."""
MOST_LISTED = 5
"""Tests, keys and reasons listed per row; the rest are counted."""
CORPUS_SOURCE = "the corpus (when measured)"
NO_TESTS = "not named (a histogram file names no tests: give the JUnit report)"

DEFAULT_REASONS = {  # for a row no report gives a reason of (a histogram file, say)
    "degraded": "declined the inputs and no other candidate could run them (the reference "
                "ran), or the key's measured winner could not run here; the run's terminal "
                "summary gives the reason",
    "rejected": "failed the F4 gate (the run's terminal summary has the gate's report)",
    "error": "raised, or ran past --arbiter-call-timeout; the next candidate ran",
    "no_candidate": "no candidate of the op applies on that target, or the target has no "
                    "device here: the reference ran",
    "stale": "a recheck found the cached winner slower than another candidate",
}

REMEDIES = {  # a line per kind of problem on the page, under the table
    "degraded": f"{GATE_REMEDY}; a measured winner that could not run here "
                "(unavailable): install what it needs on that runner, or re-tune its keys "
                "there (pytest --arbiter-tune)",
    "rejected": GATE_REMEDY,
    "error": GATE_REMEDY,
    "stale": "re-tune those keys (pytest --arbiter-tune --arbiter-recheck)",
}
"""What to do about each kind of problem, as the gate and the run's summary name it."""


@dataclass(frozen=True)
class HistogramInput:
    """What one dispatch histogram file or JUnit XML report holds, named by its path."""

    source: str
    counts: Mapping[HistogramKey, int]
    tests: Mapping[HistogramKey, Iterable[str]] = field(default_factory=dict)
    expected: Mapping[HistogramKey, int] = field(default_factory=dict)
    stale: Sequence[str] = ()
    """The ``arbiter-stale:`` lines of a JUnit report: ``TARGET/OP/BUCKET/DTYPE: why``."""
    names_tests: bool = False
    """A JUnit report (it names the tests behind each count); a histogram file does not."""
    reasons: Mapping[HistogramKey, Sequence[str]] = field(default_factory=dict)
    """The reasons a JUnit report records for each failing key (escaped, capped); a
    histogram file records none."""

    @classmethod
    def of(cls, source: str, fleet: FleetCounts) -> HistogramInput:
        return cls(source, dict(fleet.counts.items()),
                   {k: sorted(v) for k, v in fleet.tests.items()},
                   dict(fleet.expected.items()), tuple(line for _, line in fleet.stale),
                   names_tests=fleet.testcases > 0,
                   reasons={k: sorted(v) for k, v in fleet.reasons.items()})


Order = tuple[str, ...]
"""An entry's place on the page: device, op, the natural key of its bucket
(:func:`pytest_arbiter.cli.report_cells.natural_keys`), dtype, target, bucket."""


def order(e: CacheEntry, nk: str) -> Order:
    """The entry's :data:`Order`; ``nk``: its bucket's natural key."""
    return (e.device, e.op, nk, e.dtype, e.target, e.bucket)


@dataclass
class Problem:
    """One row of the table."""

    outcome: str
    what: tuple[str, str, str]
    """(target, op, candidate)."""
    source: str
    dispatches: int | None = None
    """``None``: found in the corpus, not counted by a run."""
    on_purpose: int = 0
    reasons: list[str] = field(default_factory=list)
    tests: list[str] | str = NO_TESTS
    """The tests behind the row, or a note on why none are named."""
    keys: list[CacheKey] = field(default_factory=list)
    """The first :data:`MOST_LISTED` cache keys it concerns, in the page's order."""
    key_count: int = 0
    """How many cache keys it concerns."""
    found: dict[str, Order] = field(default_factory=dict)
    """Each reason found in the corpus, with the place of the first entry that gave it."""
    first: list[tuple[Order, CacheKey]] = field(default_factory=list)

    def add_key(self, order: Order, key: CacheKey) -> None:
        self.key_count += 1
        self.first.append((order, key))
        if len(self.first) > 8 * MOST_LISTED:
            self.first = sorted(self.first)[:MOST_LISTED]

    def add_reason(self, order: Order, reason: str) -> None:
        if reason and order < self.found.get(reason, (*order, "")):
            self.found[reason] = order

    def finish(self, default: str | None = None) -> Problem:
        """The keys and reasons in the page's order (``default`` for no reason)."""
        self.keys = [key for _, key in sorted(self.first)[:MOST_LISTED]]
        self.reasons += sorted(self.found, key=self.found.__getitem__)
        if not self.reasons and default is not None:
            self.reasons.append(default)
        return self


def stale_key(line: str) -> tuple[StaleKey | None, str]:
    """The key of an ``arbiter-stale:`` line and what it says (a bucket may hold ``/``)."""
    head, _, why = line.partition(": ")
    parts = head.split("/")
    if len(parts) < 4:
        return None, line
    return (parts[0], parts[1], "/".join(parts[2:-1]), parts[-1]), why


def stale_keys(inputs: Sequence[HistogramInput]) -> set[StaleKey]:
    return {key for hist in inputs for key, _ in map(stale_key, hist.stale) if key}


def _from_inputs(inputs: Sequence[HistogramInput]) -> list[Problem]:
    found: dict[tuple[str, HistogramKey], Problem] = {}
    for hist in inputs:
        for key, count in sorted(hist.counts.items()):
            if key.outcome == "won" or count <= 0:
                continue
            problem = found.setdefault((hist.source, key), Problem(
                key.outcome, (key.target, key.op, key.selected), hist.source, 0,
                tests=[] if hist.names_tests else NO_TESTS))
            problem.dispatches = (problem.dispatches or 0) + count
            problem.on_purpose += hist.expected.get(key, 0)
            if isinstance(problem.tests, list):
                problem.tests.extend(t for t in hist.tests.get(key, ())
                                     if t not in problem.tests)
            # the run's own reasons, in place of the generic text (the corpus's follow)
            problem.reasons.extend(r for r in hist.reasons.get(key, ())
                                   if r not in problem.reasons)
    return list(found.values())


def _stale_rows(inputs: Sequence[HistogramInput]) -> list[tuple[StaleKey | None, Problem]]:
    rows = []
    for hist in inputs:
        for line in hist.stale:
            key, why = stale_key(line)
            rows.append((key, Problem(
                "stale", (key[0], key[1], "-") if key else ("-", "-", "-"), hist.source,
                reasons=[why], tests="the run's recheck of the key (no test)")))
    return rows


FAILED = ("rejected", "error")
"""What the corpus records of a kernel that failed when its key was measured: the
considered rows' outcomes that are problems. The others (``declined``,
``accepts_declined``, ``inputs_declined``, ``unavailable``) are a candidate passing on
inputs it cannot run, or a machine it cannot run on: another candidate ran."""


def _reason_of(e: CacheEntry, name: str) -> str:
    row = e.considered.get(name)
    return e.rejected.get(name) or (row.reason if row is not None else "")


def _failed_as(e: CacheEntry, name: str) -> tuple[str, str] | None:
    """How the entry ``e`` records the candidate ``name`` failing when its key was
    measured, from the typed fields (``rejected``, the considered row's ``outcome``):
    the outcome (one of :data:`FAILED`) and the reason; ``None`` when it did not."""
    row = e.considered.get(name)
    if name in e.rejected:
        outcome = "rejected"
    elif row is not None and row.outcome in FAILED:
        outcome = row.outcome
    else:
        return None
    return outcome, _reason_of(e, name) or DEFAULT_REASONS[outcome]


class Problems:
    """The table's rows, found one entry at a time, in any order: an entry's place on
    the page (``order``) keeps each row's keys and reasons in the page's order."""

    def __init__(self, inputs: Sequence[HistogramInput]) -> None:
        self.counted = _from_inputs(inputs)
        self.by_op: dict[tuple[str, str], list[Problem]] = {}
        for problem in self.counted:
            self.by_op.setdefault(problem.what[:2], []).append(problem)
        self.stale = _stale_rows(inputs)
        self.by_stale: dict[StaleKey, list[Problem]] = {}
        for key, problem in self.stale:
            if key is not None:
                self.by_stale.setdefault(key, []).append(problem)
        self.skip = {(*p.what, p.outcome) for p in self.counted}
        self.corpus: dict[tuple[str, str, str, str], Problem] = {}
        self._failing: dict[int, tuple[object, list[str]]] = {}

    def add(self, e: CacheEntry, nk: str) -> None:
        """Take the entry ``e`` in (``nk``: its bucket's natural key)."""
        if self.by_op and (e.target, e.op) in self.by_op:
            self._explain(e, order(e, nk))
        if self.by_stale and (e.target, e.op, e.bucket, e.dtype) in self.by_stale:
            for problem in self.by_stale[(e.target, e.op, e.bucket, e.dtype)]:
                problem.add_key(order(e, nk), e.key)
        if e.rejected or self._failing_in(e.considered):
            self._from_corpus(e, order(e, nk))

    def _failing_in(self, considered: Mapping[str, Considered]) -> list[str]:
        """The names ``considered`` records as failing (maps are shared by many entries:
        each is looked at once)."""
        known = self._failing.get(id(considered))
        if known is None:
            if len(self._failing) > 4096:
                self._failing.clear()
            known = self._failing[id(considered)] = (considered, [
                name for name, row in considered.items() if row.outcome in FAILED])
        return known[1]

    def _explain(self, e: CacheEntry, order: Order) -> None:
        """The keys a counted problem concerns, with the corpus's reasons: a degraded
        candidate's, the keys it wins; a rejected or raising one's, the keys the corpus
        records it failing the same way, each such record a reason. A candidate the
        corpus records as declining (or unavailable) is no problem there: another ran."""
        for problem in self.by_op[(e.target, e.op)]:
            candidate = problem.what[2]
            if problem.outcome == "degraded":
                if e.winner == candidate:
                    problem.add_key(order, e.key)
                continue
            failure = _failed_as(e, candidate)
            if failure is not None and failure[0] == problem.outcome:
                problem.add_reason(order, f"when measured: {failure[1]}")
                problem.add_key(order, e.key)

    def _from_corpus(self, e: CacheEntry, order: Order) -> None:
        """Kernels that failed the gate or raised when the entry was measured, not
        already counted by a run's histogram."""
        failed = {name: "rejected" for name in e.rejected}
        failed.update({name: e.considered[name].outcome
                       for name in self._failing_in(e.considered)})
        for name, outcome in sorted(failed.items()):
            what = (e.target, e.op, name, outcome)
            if what in self.skip:
                continue
            problem = self.corpus.get(what)
            if problem is None:
                problem = self.corpus[what] = Problem(
                    outcome, what[:3], CORPUS_SOURCE,
                    tests="none: found when the key was measured")
            problem.add_reason(order, _reason_of(e, name) or DEFAULT_REASONS[outcome])
            problem.add_key(order, e.key)

    def rows(self) -> list[Problem]:
        """Every row of the table, by outcome, then target, op and candidate."""
        rows = [p.finish(DEFAULT_REASONS.get(p.outcome, "")) for p in self.counted]
        rows += [p.finish() for _, p in self.stale]
        rows += [p.finish() for p in self.corpus.values()]
        order = {outcome: n for n, outcome in enumerate(PROBLEM_OUTCOMES)}
        return sorted(rows, key=lambda p: (order.get(p.outcome, 99), p.what, p.source))


def _listed(items: Sequence[str], none: str, total: int | None = None) -> str:
    if not items:
        return none
    shown = "<br>".join(items[:MOST_LISTED])
    more = (len(items) if total is None else total) - MOST_LISTED
    return shown + (f"<br>and {more} more" if more > 0 else "")


def _row(p: Problem, anchors: Mapping[CacheKey, str]) -> str:
    dispatches = ("-" if p.dispatches is None
                  else f"{p.dispatches}" + (f" ({p.on_purpose} on purpose)" if p.on_purpose
                                            else ""))
    tests = (text(p.tests) if isinstance(p.tests, str)
             else _listed([f"<code>{breakable_id(t)}</code>" for t in p.tests],
                          "none (outside any test)"))
    keys = _listed([f'<a href="#{anchors[k]}">{breakable("/".join(k))}</a>' if k in anchors
                    else breakable("/".join(k)) for k in p.keys], "-", p.key_count)
    if p.outcome == "degraded" and p.dispatches is not None and p.keys:
        # a report counts a fallback per candidate, not per key: the keys it wins
        keys = ('<span class="note">the keys it wins (the reports say not which fell '
                f"back):</span><br>{keys}")
    reasons = [text(r) for r in p.reasons]
    if len(reasons) > 1:
        reasons = [f"{n}. {r}" for n, r in enumerate(reasons, 1)]
    cells = [f'<td><span class="badge {p.outcome}">{text(p.outcome)}</span></td>',
             f"<td>{text(' / '.join(p.what))}</td>",
             f'<td class="num">{dispatches}</td>',
             f'<td class="reason">{_listed(reasons, "-")}</td>',
             f'<td class="tests">{tests}</td>', f'<td class="keys">{keys}</td>',
             f"<td>{breakable(p.source)}</td>"]
    return "<tr>" + "".join(cells) + "</tr>"


def section(rows: Sequence[Problem], inputs: Sequence[HistogramInput],
            anchors: Mapping[CacheKey, str]) -> list[str]:
    """The problem table's section of the page."""
    out = ['<section id="problems"><h2>Problems</h2>',
           "<p>Degraded, rejected, error, no_candidate and stale entries of the dispatch "
           "histograms and JUnit reports given, and the kernels the corpus records as "
           "failing when their key was measured, with the reasons, the tests and the "
           "cache keys concerned.</p>"]
    if not inputs:
        out.append("<p>No dispatch histogram or JUnit report was given: only the "
                   "corpus's own findings are listed.</p>")
    if not rows:
        out.append('<p class="ok">None in the corpus'
                   + (f" or in the {len(inputs)} report{'' if len(inputs) == 1 else 's'} given"
                      if inputs else "")
                   + ".</p>")
    else:
        out.append(f'<p class="bad">{len(rows)} problem{"" if len(rows) == 1 else "s"}.</p>')
        out.append('<div class="scroll"><table class="problems"><thead><tr>'
                   + "".join(f"<th>{h}</th>" for h in (
                       "outcome", "target / op / candidate", "dispatches", "reason",
                       "tests", "cache keys", "found in"))
                   + "</tr></thead><tbody>")
        out += [_row(p, anchors) for p in rows]
        out.append("</tbody></table></div>")
        out += remedies(rows)
    out.append("</section>")
    return out


def remedies(rows: Sequence[Problem]) -> list[str]:
    """A line per kind of problem the table holds: what to do about it
    (:data:`REMEDIES`)."""
    kinds = [o for o in PROBLEM_OUTCOMES if o in REMEDIES and any(p.outcome == o for p in rows)]
    if not kinds:
        return []
    return (['<ul class="remedies">']
            + [f'<li><span class="badge {o}">{o}</span>: {text(REMEDIES[o])}</li>'
               for o in kinds]
            + ["</ul>"])
