"""The decision core's vocabulary: modes, keys, verdicts and the errors of strict mode.

Every state a decision reads is one of these typed values; messages are for people and
are never read back (docs/contract.md, "One word per state").
"""

from __future__ import annotations

from typing import Literal, NamedTuple, TypeGuard

Mode = Literal["tune", "static", "strict"]
"""How a dispatch picks: measure at a miss, the cache or tier order, the cache only."""
MODES: tuple[Mode, ...] = ("tune", "static", "strict")

Source = Literal["measured", "cached", "static"]
"""Where a pick came from: timed now, the cache, or the static tier order."""

GateKind = Literal["pass", "reject", "error", "decline", "decline_inputs"]
"""The F4 gate's verdict on one candidate for one key and layout: ``pass``, ``reject``
(out of budget), ``error`` (raised, or ran past the call timeout), ``decline`` (nothing
could be checked: it declined every input) or ``decline_inputs`` (right on the key's own
generated inputs, but it declined the dispatch's)."""

RecheckStatus = Literal["", "current", "stale", "no_verdict", "not_retimed"]
"""What re-timing a cached winner found (``--arbiter-recheck``): still the fastest,
significantly slower, too few rounds for a verdict, or not re-timed (the run's recheck
budget was spent); empty: not re-timed at all."""

WinnerOut = Literal["", "degraded", "unavailable", "declined", "rejected", "error"]
"""Why a key's cached winner did not serve a dispatch another candidate (or the
reference) served: a silent fallback (``degraded``), unavailable here with one as fast
serving, it declined these inputs (not of a shape it was measured on), or the gate
rejected it (or it raised) on them; empty: it served, there is none, or it was screened
out before the dispatch (it does not apply, or is not registered)."""

MAX_PLANS = 1 << 20
"""Memoised dispatch plans (one per input signature) per generation; two generations
are kept, so up to twice this many signatures dispatch without re-planning. A slot
costs the signature's tuple (about 300 bytes); signatures of one key share one plan."""
DEFAULT_CALL_TIMEOUT_S = 60.0
"""The per-call watchdog's default: a gate or timing call this long is a hang."""


def is_mode(value: object) -> TypeGuard[Mode]:
    return value in MODES


class DispatchKey(NamedTuple):
    """What one memoised pick serves."""

    target: str
    op: str
    bucket: str
    dtype: str


ACCEPTS_FALSE = "declined the inputs (accepts() returned False)"
"""The reason of a decline through ``accepts()``."""


def exc_text(exc: BaseException) -> str:
    """``Type: message``: how an exception is named in a reason."""
    return f"{type(exc).__name__}: {exc}"
