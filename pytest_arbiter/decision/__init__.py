"""The decision core: which candidate runs a dispatch, by measurement or by tier.

Layers, each importing only those above it in this list:

- :mod:`~.states`: the vocabulary (modes, keys, verdict kinds, strict-mode errors);
- :mod:`~.screen`: can a candidate run here, on these inputs;
- :mod:`~.selection`: what a decision hands back (a pick, a key's event);
- :mod:`~.gating`: the F4 gate's typed verdicts, memoised per process;
- :mod:`~.timers`, :mod:`~.entry`, :mod:`~.tuning`: measured arbitration (gate, time
  side by side, the one ranking rule, the entry);
- :mod:`~.record`, :mod:`~.rechecking`, :mod:`~.plans`, :mod:`~.planner`: what a run
  records, re-timing a cached winner, the memoised plans and how a key's is built;
- :mod:`~.arbiter`: the :class:`Arbiter`, its hot path and its slow path.
"""

from __future__ import annotations

from pytest_arbiter.decision.arbiter import Arbiter
from pytest_arbiter.decision.selection import DispatchEvent, Selection, arbitrate
from pytest_arbiter.decision.states import (
    DEFAULT_CALL_TIMEOUT_S,
    MODES,
    CacheMiss,
    DispatchKey,
    LowConfidence,
    Mode,
    Source,
    StaleEntry,
    is_mode,
)
from pytest_arbiter.decision.timers import register_timer, timer_for
from pytest_arbiter.decision.tuning import measured_arbitrate

__all__ = [
    "DEFAULT_CALL_TIMEOUT_S",
    "MODES",
    "Arbiter",
    "CacheMiss",
    "DispatchEvent",
    "DispatchKey",
    "LowConfidence",
    "Mode",
    "Selection",
    "Source",
    "StaleEntry",
    "arbitrate",
    "is_mode",
    "measured_arbitrate",
    "register_timer",
    "timer_for",
]
