"""The plugin's settings: one definition per option, resolved once into a frozen object.

Each ``--arbiter-x`` option has an ``arbiter_x`` ini key with the same help text;
precedence is command line > ini > default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pytest_arbiter.decision.states import DEFAULT_CALL_TIMEOUT_S

if TYPE_CHECKING:
    from pytest_arbiter.decision.states import Mode

HELP_TUNE = "measure at the first cache miss and record the winners (arbiter mode 'tune')"
HELP_CACHE = "the MeasureCache artifact to read and, with --arbiter-tune, write"
HELP_HISTOGRAM = "write this run's dispatch histogram as JSON to PATH"
HELP_BASELINE = ("histogram baseline: a 'degraded', 'rejected' or 'error' entry not in it "
                 "fails the run ('stale' too with --arbiter-recheck=fail; a missing file "
                 "counts as empty)")
HELP_WRITE_BASELINE = "write this run's histogram as the new baseline (does not fail on it)"
HELP_STRICT = ("a dispatch with no cached winner, or a stale one (its code changed, or a "
               "candidate was never measured for the key), is an error (arbiter mode "
               "'strict')")
HELP_EXPLAIN = "say in the summary, per dispatch key, why each other candidate was passed over"
HELP_NO_SKIP = "a device-marked test whose device is absent fails instead of being skipped"
HELP_CALL_TIMEOUT = ("seconds a single candidate call may take in the F4 gate or the timing "
                     "before the per-call watchdog makes it an 'error' "
                     f"(default {DEFAULT_CALL_TIMEOUT_S:g}; 0 turns the watchdog off)")
HELP_RECHECK = ("re-time each key dispatched from the cache: its winner against the "
                "runner-up, side by side now; a winner significantly slower is 'stale'. "
                "'report' (the default when given bare) lists stale keys, 'fail' gates them "
                "like 'degraded', 'off' turns it off")
HELP_RECHECK_KEY_BUDGET = ("seconds of timing one key's recheck aims at (default 0.01); a "
                           "slow pair runs past it, up to 2 s, until it has the rounds a "
                           "verdict needs")
HELP_RECHECK_BUDGET = ("seconds of recheck timing one process may take in all (default 30; "
                       "0: no limit); the keys after it are not rechecked, and the summary "
                       "says how many")
HELP_TUNE_BUDGET = ("seconds of timing one key's comparison may take at most, under "
                    "--arbiter-tune (default 2; 0: no limit): slow kernels and near ties get "
                    "more rounds up to it (and up to 200 rounds, in proportion above 2 s, "
                    "1,000 at most), "
                    "a clear gap stops early; a pick that ends below the confidence target "
                    "is marked low-confidence")
TUNE_BUDGET_S = 2.0
ROUNDS_AT_DEFAULT_BUDGET = 200
MAX_ROUNDS = 1_000
"""The round limit no budget raises past: the sign test's bookkeeping grows with the
rounds, and past a thousand a near tie would spend the budget on it, not on timing."""
"""The comparison's round limit at the default budget; a larger budget raises it in
proportion (:func:`round_limit`), so fast kernels in a near tie get more rounds too."""


def round_limit(tune_budget: float | None) -> int:
    """The most rounds one key's comparison may time under ``--arbiter-tune-budget``:
    200 at the default 2 s or less, in proportion above, up to :data:`MAX_ROUNDS` (10 s
    and more: 1,000); no budget (0): the default's."""
    if not tune_budget or tune_budget <= TUNE_BUDGET_S:
        return ROUNDS_AT_DEFAULT_BUDGET
    scale = min(tune_budget / TUNE_BUDGET_S, MAX_ROUNDS / ROUNDS_AT_DEFAULT_BUDGET)
    return round(ROUNDS_AT_DEFAULT_BUDGET * scale)
HELP_BENCHMARK_JSON = ("write the comparisons this run measured in pytest-benchmark's JSON "
                       "format to PATH (one benchmark per key and candidate), for "
                       "'pytest-benchmark compare' and github-action-benchmark")
HELP_WORKER_DEVICES = ("comma-separated GPU indices for pytest-xdist workers, e.g. 0,1,2,3: "
                       "worker gwN sees only device N mod their number")


@dataclass(frozen=True)
class OptionSpec:
    """One option: its ``--arbiter-x`` flag, ``arbiter_x`` ini key, kind and help."""

    name: str
    kind: str  # "bool", "path", "list", "seconds" or "choice"
    help: str
    default: Any = None
    """A ``seconds`` option's value when none is given; a ``choice`` option's choices
    (the first: when it is not given; the second: when it is given bare)."""

    @property
    def flag(self) -> str:
        return "--arbiter-" + self.name.replace("_", "-")

    @property
    def ini(self) -> str:
        return "arbiter_" + self.name

    @property
    def dest(self) -> str:
        return "arbiter_" + self.name


OPTIONS = (
    OptionSpec("tune", "bool", HELP_TUNE),
    OptionSpec("cache", "path", HELP_CACHE),
    OptionSpec("histogram", "path", HELP_HISTOGRAM),
    OptionSpec("baseline", "path", HELP_BASELINE),
    OptionSpec("write_baseline", "path", HELP_WRITE_BASELINE),
    OptionSpec("strict", "bool", HELP_STRICT),
    OptionSpec("explain", "bool", HELP_EXPLAIN),
    OptionSpec("no_skip", "bool", HELP_NO_SKIP),
    OptionSpec("worker_devices", "list", HELP_WORKER_DEVICES),
    OptionSpec("call_timeout", "seconds", HELP_CALL_TIMEOUT, DEFAULT_CALL_TIMEOUT_S),
    OptionSpec("recheck", "choice", HELP_RECHECK, ("off", "report", "fail")),
    OptionSpec("recheck_key_budget", "seconds", HELP_RECHECK_KEY_BUDGET, 0.01),
    OptionSpec("recheck_budget", "seconds", HELP_RECHECK_BUDGET, 30.0),
    OptionSpec("tune_budget", "seconds", HELP_TUNE_BUDGET, TUNE_BUDGET_S),
    OptionSpec("benchmark_json", "path", HELP_BENCHMARK_JSON),
)


def add_options(addoption: Callable[..., Any], addini: Callable[..., Any]) -> None:
    """Add every option to a pytest option group and its ini key to the parser."""
    for spec in OPTIONS:
        if spec.kind == "bool":
            addoption(spec.flag, action="store_true", default=None, dest=spec.dest,
                      help=spec.help)
            addini(spec.ini, spec.help, type="bool", default=False)
        elif spec.kind == "choice":
            addoption(spec.flag, action="store", nargs="?", const=spec.default[1],
                      default=None, dest=spec.dest, metavar="{" + ",".join(spec.default) + "}",
                      help=spec.help)
            addini(spec.ini, spec.help, type="string", default="")
        else:
            metavar = {"path": "PATH", "list": "LIST", "seconds": "SECONDS"}[spec.kind]
            addoption(spec.flag, action="store", default=None, dest=spec.dest,
                      metavar=metavar, help=spec.help)
            addini(spec.ini, spec.help, type="string", default="")


@dataclass(frozen=True)
class ArbiterSettings:
    """The resolved settings of one run."""

    tune: bool = False
    cache: Path | None = None
    histogram: Path | None = None
    baseline: Path | None = None
    write_baseline: Path | None = None
    strict: bool = False
    explain: bool = False
    no_skip: bool = False
    worker_devices: tuple[str, ...] = ()
    call_timeout: float | None = DEFAULT_CALL_TIMEOUT_S
    """None: the watchdog is off."""
    recheck: Literal["off", "report", "fail"] = "off"
    """``off``, ``report`` or ``fail``."""
    recheck_key_budget: float | None = 0.01
    recheck_budget: float | None = 30.0
    tune_budget: float | None = TUNE_BUDGET_S
    """Seconds one key's comparison may take when tuning; None: no limit."""
    benchmark_json: Path | None = None
    """Where to write the run's measured comparisons in pytest-benchmark's format."""

    @property
    def mode(self) -> Mode:
        """The Arbiter mode: tune, else strict, else static."""
        if self.tune:
            return "tune"
        return "strict" if self.strict else "static"


def resolve(getoption: Callable[[str], Any], getini: Callable[[str], Any],
            ini_dir: Path, invocation_dir: Path) -> ArbiterSettings:
    """Settings from the command line, else the ini file, else the defaults.

    Command-line paths are relative to the invocation folder, ini paths to the ini
    file's folder. A malformed value is a ``ValueError`` naming the option.
    """
    values: dict[str, Any] = {}
    for spec in OPTIONS:
        given = getoption(spec.dest)
        if spec.kind == "bool":
            values[spec.name] = bool(given) if given is not None else bool(getini(spec.ini))
            continue
        if spec.kind == "choice":
            text = str(given if given is not None else getini(spec.ini) or "").strip()
            if text and text not in spec.default:
                raise ValueError(f"{spec.flag} (ini {spec.ini}): {text!r} is not one of "
                                 f"{', '.join(spec.default)}")
            values[spec.name] = text or spec.default[0]
            continue
        if spec.kind == "seconds":
            values[spec.name] = _seconds(spec, given if given is not None
                                         else str(getini(spec.ini) or ""))
            continue
        if spec.kind == "list":
            text = str(given if given else getini(spec.ini) or "")
            # keep empty parts: "0,,1" is a typo to report, not to guess around
            values[spec.name] = (tuple(part.strip() for part in text.split(","))
                                 if text.strip() else ())
            for part in values[spec.name]:
                if not (part.isdecimal() or part.startswith(("GPU-", "MIG-"))):
                    raise ValueError(
                        f"{spec.flag} (ini {spec.ini}): {part!r} in {text.strip()!r} is not "
                        "a device index or a GPU-/MIG- UUID (e.g. 0,1,2,3)")
            continue
        if given:
            values[spec.name] = invocation_dir / Path(given)
        else:
            text = str(getini(spec.ini) or "").strip()
            values[spec.name] = ini_dir / Path(text) if text else None
    return ArbiterSettings(**values)


def _seconds(spec: OptionSpec, text: str) -> float | None:
    """Seconds: empty means the option's default, 0 turns it off."""
    text = str(text).strip()
    if not text:
        return float(spec.default)
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{spec.flag} (ini {spec.ini}): {text!r} is not a number of "
                         "seconds") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{spec.flag} (ini {spec.ini}): {text!r} must be a finite number "
                         "of seconds, 0 or more")
    return value or None
