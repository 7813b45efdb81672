"""The run's summary (the ``arbiter`` section of pytest's terminal summary): a pure
function of the run's ledger, settings and verdict, without pytest.

Every line is printed escaped (:func:`pytest_arbiter.store.safetext.line`): candidate, op and
test names come from registrations, workers' payloads and artifacts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_arbiter.core.candidates import REGISTRY
from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.gating.baseline import GATE_REMEDY
from pytest_arbiter.gating.histogram import GATED_OUTCOMES, OUTCOMES, REFERENCE, STALE, HistogramKey
from pytest_arbiter.store.safetext import counted, line as safe_line

if TYPE_CHECKING:
    from pytest_arbiter.decision.selection import DispatchEvent
    from pytest_arbiter.decision.states import WinnerOut
    from pytest_arbiter.gating.baseline import BaselineVerdict
    from pytest_arbiter.session.ledger import EventKey, RunLedger, Unavailable
    from pytest_arbiter.session.settings import ArbiterSettings

MAX_TESTS_SHOWN = 5
MAX_KEYS_SHOWN = 20

STALE_HEADS = (
    ("winner-changed", "{n} key{s} whose cached winner changed code since it was measured: "
                       "the tier order ran (--arbiter-tune measures them again)"),
    ("unmeasured", "{n} key{s} with candidates that were never measured, or whose code "
                   "changed since (--arbiter-tune measures them; --arbiter-strict fails)"),
    ("reverify", "{n} key{s} measured under another environment: the next --arbiter-tune "
                 "re-times winner against runner-up"),
)


@dataclass
class RunVerdict:
    """What the session end decided: the baseline comparison, the baseline entries this
    run could not check, and the outcomes that fail the run."""

    verdict: BaselineVerdict | None = None
    unchecked: list[HistogramKey] = field(default_factory=list)
    failing: tuple[str, ...] = ()
    baseline_written: bool = False
    """``--arbiter-write-baseline`` wrote its file."""
    incomplete: tuple[str, ...] = ()
    """Why the run's counts are incomplete (an interrupted session, a crashed worker):
    the gate saw only the dispatches made before."""


def render(ledger: RunLedger, settings: ArbiterSettings, *, cache_note: str | None,
           baseline_note: str, end: RunVerdict, verbosity: int = 1) -> list[str]:
    """The summary's lines (empty when there is nothing to say). At pytest's default
    verbosity or below, a clean run (nothing gated, stale, low-confidence, measured,
    broken or noted) says it in one line; ``-v`` or ``--arbiter-explain`` gives every
    detail."""
    if verbosity <= 0 and not settings.explain and not _notable(ledger, settings, end):
        return [safe_line(text) for text in _one_line(
            ledger, cache_note, baseline_note, end, settings.baseline is not None)]
    return _details(ledger, settings, cache_note=cache_note, baseline_note=baseline_note,
                    end=end)


def _notable(ledger: RunLedger, settings: ArbiterSettings, end: RunVerdict) -> bool:
    """Whether the run has something a reader must see: a gated or stale entry (new or
    known), a key measured, stale or low-confidence, a fallback, an error, a crashed
    worker or an interrupted run, a note, a strict-mode refusal, an unknown op, a baseline
    entry now fixed, or a cache to read that is missing."""
    if settings.cache is not None and not settings.tune and not settings.cache.exists():
        return True
    if any(v and k.outcome in (*GATED_OUTCOMES, STALE) for k, v in ledger.counts().items()):
        return True
    if (ledger.errors or ledger.crashed or ledger.notes or end.incomplete
            or ledger.refused() or unknown_op_lines()):
        return True
    verdict = end.verdict
    if verdict is not None and (not verdict.passed or verdict.fixed):
        return True
    return any(e.source == "measured" or e.stale or e.low_confidence or e.fallback
               or e.recheck_status in ("stale", "not_retimed")
               for e in ledger.events().values())


def _one_line(ledger: RunLedger, cache_note: str | None, baseline_note: str,
              end: RunVerdict, baseline_given: bool) -> list[str]:
    """A clean run in one line: what was dispatched, from where, and the gate."""
    counts = ledger.counts()
    if not counts and cache_note is None and not baseline_given:
        return []
    by_outcome = dict.fromkeys(OUTCOMES, 0)
    for key, count in counts.items():
        by_outcome[key.outcome] += count
    parts = [cache_note] if cache_note is not None else []
    parts += [counted(sum(counts.values()), "dispatch", "dispatches") + " ("
             + ", ".join(f"{n} {name}" for name, n in by_outcome.items() if n) + ")"
             if counts else "no dispatches"]
    events = ledger.events()
    keys = _keys_line(events)
    if keys:
        parts.append(keys)
    found = [e.recheck_status for e in events.values() if e.recheck_status]
    if found:  # a stale one is notable: here every key re-timed was current, or undecided
        parts.append(f"recheck: {len(found) - found.count('not_retimed')} re-timed, "
                     f"{found.count('current')} current")
    expected = sum(v for k, v in ledger.expected_counts().items()
                   if k.outcome in (*GATED_OUTCOMES, STALE))
    if expected:
        parts.append(f"{expected} expected degrades")
    unavailable = ledger.unavailable(counts)
    if unavailable:
        parts.append(f"{len(unavailable)} candidate{'s' if len(unavailable) > 1 else ''} "
                     "unavailable here")
    gate = "degrade gate passed" if end.verdict is not None else "not gated"
    parts.append(f"{gate} ({baseline_note.split(':')[0]})")
    return ["; ".join(parts) + " (-v for details)"]


def _details(ledger: RunLedger, settings: ArbiterSettings, *, cache_note: str | None,
             baseline_note: str, end: RunVerdict) -> list[str]:
    lines: list[str] = []
    counts = ledger.counts()
    lines.extend(_histogram_lines(counts))
    expected = {k: v for k, v in ledger.expected_counts().items()
                if k.outcome in (*GATED_OUTCOMES, STALE)}
    if expected:
        lines.append("expected degrades (arbiter_expect_degrade, not gated): " + ", ".join(
            f"{_key_text(k)}={v}" for k, v in sorted(expected.items())))
    if cache_note is not None:
        lines.append(cache_note)
    events = ledger.events()
    keys = _keys_line(events)
    if keys:
        lines.append(keys)
    lines.extend(_stale_lines(events))
    lines.extend(_low_confidence_lines(events))
    if settings.recheck != "off":
        lines.extend(_recheck_lines(events, ledger.stale_keys(events), settings.recheck))
    if settings.explain:
        lines.extend(_explain_lines(events))
    else:
        lines.extend(_winner_lines(events, ledger))
    lines.extend(_refused_lines(ledger.refused()))
    for name in ledger.crashed:
        lines.append(f"worker {name} returned no arbiter data (crashed?): the run fails")
    lines.extend(ledger.notes)
    lines.extend(_unavailable_lines(ledger.unavailable(counts)))
    lines.extend(unknown_op_lines())
    for error in ledger.errors:
        lines.append(f"artifact error: {error}")
    verdict = end.verdict
    if verdict is not None and (counts or verdict.fixed or settings.baseline):
        lines.append(baseline_note)
        lines.extend(_new_entry_lines(verdict, ledger))
        lines.extend(verdict.describe_fixed())
        if end.unchecked:
            lines.append(f"{len(end.unchecked)} baseline entries not checked: this run "
                         "did not dispatch their target and op")
        if not verdict.passed:
            if settings.write_baseline is not None and end.baseline_written:
                lines.append("new gated entries recorded by --arbiter-write-baseline "
                             f"{settings.write_baseline}")
            else:
                lines.append(f"degrade gate FAILED: new {either(end.failing)} "
                             f"dispatch entries ({GATE_REMEDY})")
                if any(key.outcome == STALE for key in verdict.new):
                    lines.append("stale cached winners: re-tune those keys "
                                 "(pytest --arbiter-tune --arbiter-recheck)")
        elif end.incomplete:
            lines.append("degrade gate passed on the dispatches it received "
                         f"({'; '.join(end.incomplete)}): the rest were not gated")
        else:
            lines.append("degrade gate passed")
    return [safe_line(text) for text in lines]


def _refused_lines(refused: dict[str, int]) -> list[str]:
    """Strict mode's refusals: each raised a ``CacheMiss`` (or a subclass) into its
    caller."""
    if not refused:
        return []
    what = ", ".join(f"{n} for {kind}" for kind, n in sorted(refused.items()))
    return [f"--arbiter-strict refused {counted(sum(refused.values()), 'dispatch', 'dispatches')}"
            f" ({what}): each raised pytest_arbiter.CacheMiss into its caller; tune those "
            "keys (pytest --arbiter-tune)"]


def _keys_line(events: dict[EventKey, DispatchEvent]) -> str:
    """Where the dispatch keys' picks came from (empty when nothing dispatched)."""
    sources: list[str] = [e.source for e in events.values()]
    if not sources:
        return ""
    return "keys: " + ", ".join(
        f"{sources.count(src)} {label}"
        for src, label in (("measured", "measured"), ("cached", "reused from cache"),
                           ("static", "static tier order on a miss")))


def either(names: Sequence[str]) -> str:
    """``a, b or c``."""
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def _key_text(key: Sequence[str]) -> str:
    return "/".join(key)


def _histogram_lines(counts: dict[HistogramKey, int]) -> list[str]:
    per: dict[tuple[str, str], dict[str, int]] = {}
    for (target, op, _sel, outcome), count in counts.items():
        row = per.setdefault((target, op), dict.fromkeys(OUTCOMES, 0))
        row[outcome] += count
    if not per:
        return []
    lines = ["dispatch histogram (target/op: " + ", ".join(OUTCOMES) + "):"]
    for (target, op), row in sorted(per.items()):
        lines.append(f"  {target}/{op}: " + ", ".join(f"{name}={row[name]}"
                                                      for name in OUTCOMES))
    for key, count in sorted(counts.items()):
        lines.append(f"    {_key_text(key)}: {count}")
    return lines


def _new_entry_lines(verdict: BaselineVerdict, ledger: RunLedger) -> list[str]:
    """Each new failing entry, its reason, and the tests behind it."""
    from pytest_arbiter.gating.junit import reason_text  # only a failing run needs it

    reasons = ledger.reasons()
    lines = []
    for line, key in zip(verdict.describe_new(), sorted(verdict.new), strict=True):
        lines.append(line)
        why = reasons.get(key)
        if why:  # one line, cut as the JUnit report records it
            lines.append(f"    reason: {reason_text(why)}")
        tests = sorted(set(ledger.tests.get(key, [])))  # the same under xdist or not
        shown = ", ".join(tests[:MAX_TESTS_SHOWN])
        more = len(tests) - MAX_TESTS_SHOWN
        lines.append("    tests: " + (shown or "none (dispatched outside any test)")
                     + (f" (+{more} more)" if more > 0 else ""))
    return lines


WINNER_OUT: dict[WinnerOut, str] = {
    "": "",
    "degraded": "could not run here: degraded",
    "unavailable": "is unavailable here, {ran} as fast",
    "declined": "declined these inputs",
    "rejected": "was rejected by the F4 gate on these inputs",
    "error": "raised on these inputs",
}
"""The winners line's words for each :data:`~.states.WinnerOut`."""


def _winner_lines(events: dict[EventKey, DispatchEvent], ledger: RunLedger,
                  most: int = MAX_KEYS_SHOWN) -> list[str]:
    """Each key's candidate that ran, and the cached winner when that is another one."""
    picked = [(key, event) for key, event in sorted(events.items())
              if event.order and event.source in ("measured", "cached")]
    if not picked:
        return []
    cached = _cached_winners(ledger, {key for key, _ in picked[:most]})
    lines = ["winners:"]
    for key, event in picked[:most]:
        how = "measured" if event.source == "measured" else "reused from cache"
        ran = event.ran or event.order[0]
        if ran == REFERENCE:
            ran, how = "the reference", how + "; no candidate could run"
        winner = cached.get(key, ran)
        if event.winner_out:
            out = WINNER_OUT[event.winner_out].format(ran=ran)
            how += f"; the cached winner {winner} {out}"
        lines.append(f"  {_key_text(key)}: {ran} ({how})")
    if len(picked) > most:
        lines.append(f"  ... and {len(picked) - most} more (--arbiter-explain lists them all)")
    return lines


def _cached_winners(ledger: RunLedger, keys: set[EventKey]) -> dict[EventKey, str]:
    """The cache's winner for each of ``keys`` (target, op, bucket, dtype), ``a@dev,
    b@dev`` when several devices hold the key."""
    if ledger.arbiter is None:
        return {}
    cache = ledger.arbiter.cache
    found: dict[EventKey, dict[str, str]] = {}
    for device in sorted(cache.devices()):
        for key in keys:
            try:
                entry = cache.get((device, *key))  # type: ignore[arg-type]
            except ArtifactError:
                continue  # damaged, and not this run's: named when a run needs it
            if entry is not None:
                found.setdefault(key, {})[device] = entry.winner
    return {key: (next(iter(by_device.values())) if len(set(by_device.values())) == 1
                  else ", ".join(f"{w}@{d}" for d, w in sorted(by_device.items())))
            for key, by_device in found.items()}


def _low_confidence_lines(events: dict[EventKey, DispatchEvent],
                          most: int = MAX_KEYS_SHOWN) -> list[str]:
    """The keys whose pick has too little evidence behind it (docs/artifacts.md)."""
    low = [key for key, event in sorted(events.items()) if event.low_confidence]
    if not low:
        return []
    lines = [f"low-confidence picks: {len(low)} key{'' if len(low) == 1 else 's'} (re-tune "
             "with a larger --arbiter-tune-budget; --arbiter-strict fails on them):"]
    lines.extend(f"  {_key_text(key)}" for key in low[:most])
    if len(low) > most:
        lines.append(f"  ... and {len(low) - most} more")
    return lines


def _stale_lines(events: dict[EventKey, DispatchEvent],
                 most: int = MAX_KEYS_SHOWN) -> list[str]:
    """The keys whose cache entries are out of date, by kind (docs/artifacts.md)."""
    by_kind: dict[str, list[tuple[str, str]]] = {}
    for key, event in sorted(events.items()):
        for kind, why in event.stale.items():
            by_kind.setdefault(kind, []).append((_key_text(key), why))
    lines: list[str] = []
    for kind, head in STALE_HEADS:
        found = by_kind.get(kind, [])
        if not found:
            continue
        lines.append(head.format(n=len(found), s="" if len(found) == 1 else "s"))
        lines.extend(f"  {key}: {why}" for key, why in found[:most])
        if len(found) > most:
            lines.append(f"  ... and {len(found) - most} more")
    return lines


def _recheck_lines(events: dict[EventKey, DispatchEvent], stale: list[str],
                   mode: str) -> list[str]:
    found = [e.recheck_status for e in events.values() if e.recheck_status]
    kinds = {kind: found.count(kind) for kind in ("current", "stale", "no_verdict",
                                                   "not_retimed")}
    lines = [f"recheck: {len(found) - kinds['not_retimed']} cached keys re-timed: "
             f"{kinds['stale']} stale, {kinds['current']} current, "
             f"{kinds['no_verdict']} without a verdict"
             + (f"; {kinds['not_retimed']} not re-timed (the run's recheck budget was spent)"
                if kinds["not_retimed"] else "")]
    lines.extend(f"  {line}" for line in stale)
    if kinds["stale"] and mode != "fail":
        lines.append("  (report only: --arbiter-recheck=fail gates stale keys)")
    return lines


def _explain_lines(events: dict[EventKey, DispatchEvent]) -> list[str]:
    lines = []
    for key, event in sorted(events.items()):
        ran = event.ran or (event.order[0] if event.order else "")
        picked = (f"ran {ran}" if ran and ran != REFERENCE
                  else "no candidate could run: the reference ran")
        if event.low_confidence:
            picked += " (low-confidence pick)"
        lines.append(f"{_key_text(key)} [{event.source}]: {picked}")
        if event.fallback:
            lines.append(f"  degraded: {event.fallback}")
        ahead = True  # the names ranked above the one that ran
        for name in event.order:
            if name == ran:
                ahead = False
                continue
            ratio = event.ratios.get(name)
            why = ("ahead in the order, but it did not run the key's last inputs" if ahead
                   else f"slower by {(ratio - 1) * 100:.1f}%" if ratio is not None
                   else "lower in the order")
            lines.append(f"  passed over {name}: {why}")
        for name, why in sorted(event.passed_over.items()):
            lines.append(f"  passed over {name}: {why}")
    return lines


def _unavailable_lines(found: Sequence[Unavailable]) -> list[str]:
    if not found:
        return []
    lines = [f"{len(found)} candidate{'s' if len(found) > 1 else ''} of the dispatched ops "
             "unavailable here (never timed nor run on this machine):"]
    lines += [f"  {u.target}/{u.op}/{u.name} (tier {u.tier}): {u.reason}"
              for u in found[:MAX_KEYS_SHOWN]]
    if len(found) > MAX_KEYS_SHOWN:
        lines.append(f"  ... and {len(found) - MAX_KEYS_SHOWN} more")
    return lines


def unknown_op_lines() -> list[str]:
    """The summary's lines on candidates registered for an op no ``op()`` registers and
    no built-in has; the op registry (and NumPy) is imported only when a candidate was
    registered."""
    if not REGISTRY.registered():
        return []
    from pytest_arbiter.core.ops import unknown_op_lines as lines_of_the_ops

    return lines_of_the_ops()
