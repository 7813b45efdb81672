"""The MeasureCache and its schema: ``pytest-arbiter/cache``, version 3.

The classes below are the format's documentation and its validation: a cache file is
decoded by msgspec straight into them (:mod:`pytest_arbiter.store.cache_file`), in one pass
that checks every type and bound and names the JSON path of a bad value
(``$.entries[3].ranking[0].stats.samples``); unknown fields, NaN, infinities and
out-of-range numbers are refused. An entry built in code is checked the same way when
it is built.

Every struct is frozen and untracked by the garbage collector (``gc=False``): a loaded
corpus of a million entries leaves the collector almost nothing to walk. What many
entries share (the tuning run's host and versions, the environment, the candidates
considered and their code fingerprints) is written once, in a table at the top of the
file, and read into one shared, immutable :class:`FrozenMap` that every entry of that
row points at. docs/artifacts.md describes the file.
"""

from __future__ import annotations

import datetime
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, NamedTuple, TypeVar

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType
from msgspec.structs import force_setattr

from pytest_arbiter.core.changes import Listeners
from pytest_arbiter.timing.measure import LatencyStats

CACHE_SCHEMA = "pytest-arbiter/cache"
CACHE_VERSION = 3
"""Version 3: entries are objects with named fields, shared data in tables. Versions 1
and 2 are still read (:mod:`pytest_arbiter.store.cache_legacy`)."""

class CacheKey(NamedTuple):
    """What one cache entry serves. A plain 5-tuple in this order finds the same entry."""

    device: str
    """The device tag (``sm_120``, ``gfx1151``, a CPU model tag)."""
    target: str
    op: str
    bucket: str
    """The shape bucket (:meth:`pytest_arbiter.core.regions.Region.bucket`)."""
    dtype: str

CONFIDENT = 0.99
"""An entry at or above this confidence (and not a tie) is a clear pick; two clear picks
of different winners for one key, measured against the same code and environment, are
a merge conflict."""

RowOutcome = Literal["timed", "rejected", "error", "declined", "accepts_declined",
                     "inputs_declined", "unavailable"]
"""What became of a candidate considered for a key (:class:`Considered`): ``timed`` (in
the comparison), ``rejected`` (failed the F4 gate), ``error`` (raised), ``declined``
(declined in the gate or while timed: measured, until its code changes),
``accepts_declined`` (its ``accepts()`` turned down the measured inputs: measured when it
accepts a later dispatch's), ``inputs_declined`` (declined the only inputs there were to
try, a user op's: a later tuning dispatch tries it on its own), ``unavailable`` (could
not run on the measuring machine: measured where it can)."""
OUTCOMES: tuple[RowOutcome, ...] = ("timed", "rejected", "error", "declined",
                                    "accepts_declined", "inputs_declined", "unavailable")
RETRIED: frozenset[RowOutcome] = frozenset({"accepts_declined", "inputs_declined",
                                            "unavailable"})
"""Row outcomes that leave the candidate to be measured again (see :data:`RowOutcome`)."""
MIN_ROUNDS = 7
"""Fewer timed rounds than this behind a pick of two or more candidates is too little
evidence for any claim: the entry is low-confidence whatever its p-value."""

_UTC = datetime.timezone.utc
NO_SINCE = datetime.datetime(1970, 1, 1, tzinfo=_UTC)
FUTURE_SLACK = datetime.timedelta(minutes=10)
"""How far ahead of this machine's clock an entry's ``since`` may be (clocks drift)."""
"""The ``since`` of an entry that does not know what it was measured against (one read
from a version 1 or 2 file, or built without it): older than any measurement."""

Name = Annotated[str, Meta(min_length=1)]
Count = Annotated[int, Meta(ge=0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
Since = Annotated[datetime.datetime, Meta(tz=True)]

K = TypeVar("K")
V = TypeVar("V")

KeyTuple = tuple[str, str, str, str, str]
"""A :class:`CacheKey`'s values as a plain tuple: what a cache's table is keyed by. The
garbage collector stops tracking exact tuples of strings, not named ones, and a loaded
corpus holds a key per entry."""

plain_key: Callable[[CacheEntry], KeyTuple] = attrgetter(
    "device", "target", "op", "bucket", "dtype")
"""An entry's key as a :data:`KeyTuple` (one C call)."""


class FrozenMap(Mapping[K, V], Generic[K, V]):
    """A read-only mapping, equal and hashable by content.

    Many entries point at one: equal maps are interned (one object per content in the
    process, while anything uses it), so entries read from two copies of one file
    share them, compare them by identity and keep one copy in memory.
    """

    __slots__ = ("__weakref__", "_hash", "_items")
    _items: dict[K, V]
    _hash: int | None

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        self._items = dict(items)
        self._hash = None

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: K, default: Any = None) -> Any:
        return self._items.get(key, default)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, FrozenMap):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._items == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        found = self._hash
        if found is None:
            found = self._hash = hash(frozenset(self._items.items()))
        return found

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._items!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_interned, (type(self), self._items))

    def to_dict(self) -> dict[K, V]:
        """A plain dict of the items, sorted by key."""
        return {k: self._items[k] for k in sorted(self._items)}  # type: ignore[type-var]


def _sorted_items(mapping: Mapping[Any, Any]) -> list[tuple[Any, Any]]:
    """The items of a mapping sorted by key (a FrozenMap's read straight from its dict)."""
    items = mapping._items if isinstance(mapping, FrozenMap) else mapping
    return sorted(items.items())


def _sorted_dict(mapping: Mapping[Any, Any]) -> dict[Any, Any]:
    return dict(_sorted_items(mapping))


_INTERNED: weakref.WeakValueDictionary[Any, FrozenMap[Any, Any]] = \
    weakref.WeakValueDictionary()
_INTERN_LOCK = threading.Lock()

M = TypeVar("M", bound=FrozenMap[Any, Any])


def _interned(cls: type[M], items: Mapping[Any, Any]) -> M:
    """The one ``cls`` of these items in the process (made if there is none)."""
    made = cls(items)
    tag = (cls, frozenset(made._items.items()))
    with _INTERN_LOCK:
        found = _INTERNED.get(tag)
        if found is None:
            _INTERNED[tag] = made
            return made
    return found  # type: ignore[return-value]


class Environment(FrozenMap[str, str]):
    """What an entry's timings are valid under: the device's name and the versions of
    what runs the kernels (``numpy``, ``blas``, ``python``; ``cupy``, ``cuda_runtime``,
    ``driver`` on a GPU). A new driver or BLAS makes a new environment."""

    __slots__ = ()


class Reasons(FrozenMap[str, str]):
    """Candidate name to the reason it was passed over (an entry's ``rejected``)."""

    __slots__ = ()


class Versions(FrozenMap[str, str]):
    """Package name to version (``pytest-arbiter``, ``numpy``, ``python``)."""

    __slots__ = ()


class Run(FrozenMap[str, Any]):
    """The provenance that every entry of one tuning run shares: ``host``,
    ``device_name`` and ``versions`` (any of them may be missing)."""

    __slots__ = ()


class _RunRow(Struct, frozen=True, gc=False, forbid_unknown_fields=True, omit_defaults=True):
    device_name: str | UnsetType = UNSET
    host: str | UnsetType = UNSET
    versions: dict[str, str] | UnsetType = UNSET


class Considered(Struct, frozen=True, gc=False, forbid_unknown_fields=True,
                 omit_defaults=True):
    """One candidate considered for a key: what its code was, and what became of it."""

    fingerprint: Name
    """A short hash of the candidate's code (``fingerprint_of``)."""
    outcome: RowOutcome
    """What became of it (:data:`RowOutcome`)."""
    reason: str = ""
    """Why it was not timed (empty when it was)."""

    def to_dict(self) -> dict[str, str]:
        """``fingerprint``, ``outcome`` and, when there is one, ``reason``."""
        out = {"fingerprint": self.fingerprint, "outcome": self.outcome}
        if self.reason:
            out["reason"] = self.reason
        return out


class ConsideredMap(FrozenMap[str, Considered]):
    """Candidate name to :class:`Considered`: every candidate measured for a key."""

    __slots__ = ()


NO_REASONS = _interned(Reasons, {})
NO_CONSIDERED = _interned(ConsideredMap, {})
NO_ENVIRONMENT = _interned(Environment, {})
NO_RUN = _interned(Run, {})

if TYPE_CHECKING:  # what code reads and passes: after __post_init__ the shared types
    _ReasonsField = Mapping[str, str]
    _ConsideredField = Mapping[str, Considered]
    _EnvironmentField = Mapping[str, str]
    _RunField = Run
else:  # what the file holds: an index into a table of the file, or the object itself
    _Index = Annotated[int, Meta(ge=0)]
    _ReasonsField = dict[str, str]
    _ConsideredField = _Index | dict[str, Considered]
    _EnvironmentField = _Index | dict[str, str]
    _RunField = _Index | _RunRow


class RankedCandidate(Struct, frozen=True, gc=False, forbid_unknown_fields=True,
                      omit_defaults=True):
    """One timed candidate of an entry. The ranking rule (docs/artifacts.md): the rows
    timed side by side in the entry's latest comparison come first, fastest first; a
    row kept from an earlier comparison is ``carried`` and ranks after all of them."""

    name: Name
    stats: LatencyStats
    carried: bool = False
    """Not timed in the entry's latest comparison: its statistics are from an earlier
    one (another run, maybe another shape of the bucket), and place it nowhere."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.stats.to_dict(), "carried": self.carried}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankedCandidate:
        return cls(str(data["name"]), LatencyStats.from_dict(data),
                   bool(data.get("carried", False)))


_RUN_KEYS = ("device_name", "host", "versions")
_OWN_KEYS = ("measured_at", "p_value", "rounds", "shapes", "spent_ns", "timed_alone",
             "timed_ns")
PROVENANCE_KEYS = tuple(sorted(_RUN_KEYS + _OWN_KEYS))
"""The keys a provenance may have."""


class Provenance(Struct, frozen=True, gc=False, forbid_unknown_fields=True,
                 omit_defaults=True, kw_only=True):
    """Who measured an entry, when, and what the measurement cost: typed fields (an
    unset one is ``UNSET``, which is falsy), :meth:`to_dict` for plain JSON. ``run`` is
    the part every entry of one tuning run shares (written once, in the file's
    ``runs``): read it through :attr:`host`, :attr:`device_name` and ``run["versions"]``.
    """

    run: _RunField = NO_RUN
    """``host``, ``device_name``, ``versions``: shared by the run's entries."""
    measured_at: str | UnsetType = UNSET
    """UTC time of the measurement, to the second (``2026-12-03T06:23:11Z``)."""
    shapes: str | UnsetType = UNSET
    """The input shapes that were measured: each its dimensions joined by ``x``, ``()``
    for a 0-d input, the inputs joined by ``,`` (``"64x32,32x16"``). One string, not an
    array of arrays of numbers: fewer objects, and none the garbage collector tracks;
    :attr:`shape_lists` gives the lists of integers."""
    rounds: Count | UnsetType = UNSET
    timed_ns: Count | UnsetType = UNSET
    """Sum of the timed calls."""
    spent_ns: Count | UnsetType = UNSET
    """Wall time of the comparison."""
    p_value: Probability | UnsetType = UNSET
    """The sign test's p-value of the pick against the closest other candidate."""
    timed_alone: bool | UnsetType = UNSET
    """Whether the timing held the device's measurement lock (no other worker timed on
    the device meanwhile); False when it timed anyway, after waiting too long or
    without a lock file."""

    @classmethod
    def of(cls, data: Provenance | Mapping[str, Any]) -> Provenance:
        """The provenance of a dict of :data:`PROVENANCE_KEYS` (what the arbiter and
        older files give); ``ValueError`` for another key."""
        if isinstance(data, Provenance):
            return data
        unknown = sorted(set(data) - set(PROVENANCE_KEYS))
        if unknown:
            raise ValueError(f"unknown provenance keys {unknown}; a provenance has "
                             f"{', '.join(PROVENANCE_KEYS)}")
        run = {k: data[k] for k in _RUN_KEYS if k in data}
        if "versions" in run:
            run["versions"] = _interned(Versions, run["versions"])
        own: dict[str, Any] = {k: data[k] for k in _OWN_KEYS if k in data}
        if "shapes" in own and not isinstance(own["shapes"], str):
            own["shapes"] = shapes_text(own["shapes"])
        return cls(run=_interned(Run, run), **own)

    @property
    def host(self) -> str | None:
        """The machine that measured (``None``: not recorded)."""
        return self.run.get("host")

    @property
    def device_name(self) -> str | None:
        """The device's name as its probe gave it (``None``: not recorded)."""
        return self.run.get("device_name")

    @property
    def shape_lists(self) -> list[list[int]] | None:
        """:attr:`shapes` as lists of integers (``None``: not recorded)."""
        return None if self.shapes is UNSET else _dimensions(self.shapes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values, sorted (``versions`` a dict, ``shapes`` lists of integers)."""
        out = dict(self.run._items) if type(self.run) is Run else {}
        versions = out.get("versions")
        if versions is not None:
            out["versions"] = _sorted_dict(versions)
        for key in _OWN_KEYS:
            value = getattr(self, key)
            if value is not UNSET:
                out[key] = _dimensions(value) if key == "shapes" else value
        return _sorted_dict(out)


def _check_row(row: RankedCandidate) -> None:
    """A ranking row's statistics must be possible: ordered, and not all zero."""
    st = row.stats
    if not (0 <= st.min_ns <= st.q1_ns <= st.median_ns <= st.q3_ns <= st.max_ns
            and st.max_ns > 0):
        raise ValueError(
            f"ranking row {row.name!r}: its latencies must satisfy 0 <= min <= q1 <= "
            f"median <= q3 <= max and not all be zero; got min {st.min_ns}, q1 {st.q1_ns}, "
            f"median {st.median_ns}, q3 {st.q3_ns}, max {st.max_ns}")


def shapes_text(shapes: Iterable[Iterable[int]]) -> str:
    """``[[64, 32], [32, 16]]`` as ``"64x32,32x16"`` (a 0-d shape as ``()``)."""
    return ",".join("x".join(str(int(d)) for d in shape) or "()" for shape in shapes)


def _dimensions(text: str) -> Any:
    """``"64x32,32x16"`` as ``[[64, 32], [32, 16]]``; text of a hand-written file that is
    not shapes is given as it is."""
    try:
        return [[] if shape == "()" else [int(d) for d in shape.split("x")]
                for shape in text.split(",")] if text else []
    except ValueError:
        return text


NO_PROVENANCE = Provenance()


class CacheEntry(Struct, frozen=True, gc=False, forbid_unknown_fields=True,
                 omit_defaults=True, order=True):
    """A measured pick for one key, with the full ranking, the evidence behind it and
    what it was measured against. Entries order by their key (the first five fields).

    Built in code, ``rejected``, ``provenance``, ``considered`` and ``environment`` may
    be plain dicts (they are turned into the shared, immutable types) and ``ranking``
    any sequence.
    """

    device: Name
    """The exact device tag the timings come from (``sm_120``, ``cpu-x86_64-...``)."""
    target: Name
    op: Name
    bucket: str
    dtype: Name
    ranking: Annotated[tuple[RankedCandidate, ...], Meta(min_length=1)]
    """Every gate-passing candidate that was timed, fastest first: the first is the winner."""
    confidence: Probability = 1.0
    """1 minus the worst one-sided sign-test p-value of the winner against each other
    timed candidate; 1 when only one was timed."""
    tie: bool = False
    """The rounds did not separate the leaders by more than the tie margin."""
    rejected: _ReasonsField = NO_REASONS
    """Candidates passed over when measuring, with the reason."""
    provenance: Provenance = NO_PROVENANCE
    """Who measured the entry, when, at what cost (:class:`Provenance`; a dict of its
    keys when built in code)."""
    considered: _ConsideredField = NO_CONSIDERED
    """Every candidate considered for the key, with its code's fingerprint."""
    environment: _EnvironmentField = NO_ENVIRONMENT
    """What the timings are valid under (:class:`Environment`)."""
    reverify: bool = False
    """The environment changed since the measurement: the next tune re-times the
    winner against the runner-up."""
    since: Since = NO_SINCE
    """When an entry of this key was first measured against these fingerprints and this
    environment (kept by a re-measurement that finds them unchanged): the merge rule's
    first criterion (docs/artifacts.md)."""

    def __post_init__(self) -> None:
        tables = _READING.tables
        if tables is None:
            self._check()
            return
        # Decoding (a file, a payload, an entry built in code being checked): the shared
        # fields are indices into the document's tables, read before the entries, or
        # inline objects. This runs for every entry of a file: the common case inline
        # (an index into a table read already), anything else in _resolved.
        prov = self.provenance
        if type(prov) is Provenance:
            value: Any = prov.run
            if type(value) is int:
                try:
                    force_setattr(prov, "run", tables.runs[value])  # type: ignore[index]
                except (TypeError, IndexError):
                    force_setattr(prov, "run", _resolved(value, tables, "runs"))
            elif type(value) is not Run:
                force_setattr(prov, "run", _resolved(value, tables, "runs"))
        else:
            force_setattr(self, "provenance", Provenance.of(prov))
        value = self.environment
        if type(value) is int:
            try:
                force_setattr(self, "environment",
                              tables.environments[value])  # type: ignore[index]
            except (TypeError, IndexError):
                force_setattr(self, "environment", _resolved(value, tables, "environments"))
        elif type(value) is not Environment:
            force_setattr(self, "environment", _resolved(value, tables, "environments"))
        value = self.considered
        if type(value) is int:
            try:
                force_setattr(self, "considered", tables.considered[value])  # type: ignore[index]
            except (TypeError, IndexError):
                force_setattr(self, "considered", _resolved(value, tables, "considered"))
        elif type(value) is not ConsideredMap:
            force_setattr(self, "considered", _resolved(value, tables, "considered"))
        value = self.rejected
        if type(value) is not Reasons:
            force_setattr(self, "rejected", _interned(Reasons, value))
        since = self.since
        if since.tzinfo is not _UTC:  # written and compared in UTC
            since = since.astimezone(_UTC)
        if since > tables.latest:
            raise ValueError(
                f"since {since:%Y-%m-%dT%H:%M:%SZ} is in the future (this machine's clock "
                "says it is earlier): the runner that measured it has a clock ahead; fix "
                "its clock and measure the key again")
        # one object for each repeated value of the document: a million entries of a few
        # devices, ops and candidates hold a few strings, not several million
        one = tables.strings.setdefault
        force_setattr(self, "since", one(since, since))
        force_setattr(self, "device", one(self.device, self.device))
        force_setattr(self, "target", one(self.target, self.target))
        force_setattr(self, "op", one(self.op, self.op))
        force_setattr(self, "dtype", one(self.dtype, self.dtype))
        for row in self.ranking:
            force_setattr(row, "name", one(row.name, row.name))
            _check_row(row)

    def _check(self) -> None:
        """An entry built in code goes through the schema as a file's would: what a
        reader would refuse (a NaN, a negative latency, a confidence over 1, an unknown
        provenance key) is a ``ValueError`` now, not at the next write, and its values
        become what a read gives back (a confidence of ``1`` as ``1.0``, a latency of
        ``1217.0`` as ``1217``, ``since`` in UTC)."""
        try:
            since = self.since
            if getattr(since, "tzinfo", _UTC) is None:
                raise ValueError(f"since must carry a time zone, got {since!r}")
            force_setattr(self, "provenance", Provenance.of(self.provenance))
            raw = msgspec.to_builtins(self, enc_hook=_inline)
            checked = _read_tables(lambda: msgspec.convert(raw, CacheEntry), _Tables())
        except (TypeError, ValueError, msgspec.ValidationError) as exc:
            message = _message(exc) if isinstance(exc, msgspec.ValidationError) else exc
            raise ValueError(f"cache entry {'/'.join(map(str, self.key))}: {message}"
                             ) from None
        for name in self.__struct_fields__:
            force_setattr(self, name, getattr(checked, name))
        force_setattr(self, "ranking", tuple(
            RankedCandidate(r.name, r.stats.whole(), r.carried) for r in self.ranking))

    @property
    def key(self) -> CacheKey:
        return CacheKey(self.device, self.target, self.op, self.bucket, self.dtype)

    @property
    def winner(self) -> str:
        return self.ranking[0].name

    @property
    def samples(self) -> int:
        """How many timed rounds stand behind the winner."""
        return self.ranking[0].stats.samples

    @property
    def spread(self) -> float:
        """The winner's interquartile range relative to its median."""
        return self.ranking[0].stats.spread

    @property
    def confident(self) -> bool:
        """A clear pick: not a tie, and the comparison's confidence reached CONFIDENT."""
        return not self.tie and self.confidence >= CONFIDENT

    @property
    def low_confidence(self) -> bool:
        """Too little evidence behind a pick among two or more timed candidates: fewer
        than :data:`MIN_ROUNDS` rounds, or neither a tie nor :data:`CONFIDENT`."""
        if sum(1 for row in self.ranking if not row.carried) < 2:
            return False
        rounds = self.provenance.rounds
        if isinstance(rounds, int) and rounds < MIN_ROUNDS:
            return True
        return not self.tie and self.confidence < CONFIDENT

    @property
    def timed_count(self) -> int:
        """How many of the key's candidates were timed for it (its ``timed`` rows; the
        ranking's length for an entry that does not say)."""
        if not self.considered:
            return len(self.ranking)
        return sum(1 for row in self.considered.values() if row.outcome == "timed")

    def fingerprints(self) -> dict[str, str]:
        """Candidate name to the fingerprint of the code it was measured with."""
        return {name: c.fingerprint for name, c in self.considered.items()}

    def same_basis(self, other: CacheEntry) -> bool:
        """Measured against the same candidates' code and the same environment."""
        return (self.environment == other.environment
                and (self.considered is other.considered
                     or self.fingerprints() == other.fingerprints()))

    def to_dict(self) -> dict[str, Any]:
        """The self-contained form (``pytest-arbiter show --json``): plain JSON values."""
        out: dict[str, Any] = {
            "device": self.device, "target": self.target, "op": self.op,
            "bucket": self.bucket, "dtype": self.dtype, "winner": self.winner,
            "ranking": [r.to_dict() for r in self.ranking],
            "confidence": self.confidence, "tie": self.tie,
            "low_confidence": self.low_confidence,
            "rejected": _sorted_dict(self.rejected),
            "provenance": Provenance.of(self.provenance).to_dict(),
            "considered": {name: c.to_dict() for name, c in _sorted_items(self.considered)},
            "environment": _sorted_dict(self.environment),
            "reverify": self.reverify,
        }
        if self.since != NO_SINCE:
            out["since"] = msgspec.to_builtins(self.since)
        return out

    def canonical(self) -> bytes:
        """Canonical JSON of the entry (every key sorted, tables inlined): the merge
        rule's last tie-break."""
        return _CANONICAL.encode(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CacheEntry:
        """The entry of its :meth:`to_dict` form (``winner`` optional, checked)."""
        ranking = tuple(RankedCandidate.from_dict(r) for r in data["ranking"])
        if not ranking:
            raise ValueError("an entry needs at least one ranked candidate")
        if data.get("winner", ranking[0].name) != ranking[0].name:
            raise ValueError(f"winner {data['winner']!r} is not first in the ranking")
        considered = {str(name): _convert(c, Considered)
                      for name, c in data.get("considered", {}).items()}
        since = data.get("since")
        return cls(str(data["device"]), str(data["target"]), str(data["op"]),
                   str(data["bucket"]), str(data["dtype"]), ranking,
                   float(data.get("confidence", 1.0)), bool(data.get("tie", False)),
                   dict(data.get("rejected", {})), Provenance.of(data.get("provenance", {})),
                   considered, dict(data.get("environment", {})),
                   bool(data.get("reverify", False)),
                   NO_SINCE if since is None else _convert(since, Since))


def since_for(old: CacheEntry | None, considered: Mapping[str, Considered],
              environment: Mapping[str, str], now: datetime.datetime, *,
              supersede: bool = False) -> datetime.datetime:
    """The ``since`` of a new measurement of a key: the old entry's when it was measured
    against the same fingerprints and environment, else ``now`` (never before the old
    one's).

    What makes a re-measurement of unchanged code compete with the old entry on its
    evidence, and a measurement of changed code (or a new environment, or a candidate
    added or removed) supersede it (the merge rule, :func:`pytest_arbiter.store.corpus.prefer`).
    ``supersede``: the new measurement replaces the old one whatever its evidence (a
    recheck found the old winner slower now: the old evidence is of another world).
    """
    if old is None or old.since == NO_SINCE:
        return now
    fingerprints = {name: c.fingerprint for name, c in considered.items()}
    if (not supersede and dict(old.environment) == dict(environment)
            and old.fingerprints() == fingerprints):
        return old.since
    return max(now, old.since)


def utc_now() -> datetime.datetime:
    """Now, in UTC, to the microsecond: a ``since``."""
    return datetime.datetime.now(datetime.timezone.utc)


class MeasureCache:
    """Winners by key; O(1) lookups, thread-safe updates, a version counter, and
    :attr:`changed`, which tells the arbiters' plan tables of every change."""

    def __init__(self, entries: Iterable[CacheEntry] = ()) -> None:
        self._entries: dict[KeyTuple, CacheEntry] = {}
        self._lock = threading.Lock()
        self.version = 0
        self.changed = Listeners()
        for entry in entries:
            self._entries[plain_key(entry)] = entry

    @classmethod
    def of_keyed(cls, by_key: dict[KeyTuple, CacheEntry]) -> MeasureCache:
        """A cache that takes ``by_key`` over; each value's ``key`` must be its key."""
        cache = cls()
        cache._entries = by_key
        return cache

    def by_key(self) -> dict[KeyTuple, CacheEntry]:
        """A snapshot of the entries by key (a new dict)."""
        with self._lock:
            return dict(self._entries)

    def get(self, key: KeyTuple) -> CacheEntry | None:
        """The entry of ``key`` (a :class:`CacheKey`, or a plain tuple in its order)."""
        return self._entries.get(key)

    def put(self, entry: CacheEntry) -> None:
        with self._lock:
            self._entries[plain_key(entry)] = entry
            self.version += 1
        self.changed.fire()

    def clear(self) -> None:
        """Remove every entry."""
        with self._lock:
            self._entries = {}
            self.version += 1
        self.changed.fire()

    def update(self, entries: Iterable[CacheEntry]) -> None:
        with self._lock:
            for entry in entries:
                self._entries[plain_key(entry)] = entry
            self.version += 1
        self.changed.fire()

    def entries(self) -> list[CacheEntry]:
        """Every entry, sorted by key."""
        with self._lock:
            return [self._entries[k] for k in sorted(self._entries)]

    def __iter__(self) -> Iterator[CacheEntry]:
        """Every entry, in no particular order (a snapshot: cheaper than entries())."""
        with self._lock:
            return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries


# -- what the file's decoder (cache_file) and CacheEntry.__post_init__ share -----------


def _run_of(row: _RunRow | Mapping[str, Any]) -> Run:
    items = msgspec.structs.asdict(row) if isinstance(row, _RunRow) else dict(row)
    if items.get("versions", UNSET) is not UNSET:
        items["versions"] = _interned(Versions, items["versions"])
    return _interned(Run, {k: v for k, v in items.items() if v is not UNSET})


class _Tables:
    """The shared rows of one document, as the objects its entries point at (``None``:
    not read yet)."""

    def __init__(self, runs: list[Run] | None = None,
                 environments: list[Environment] | None = None,
                 considered: list[ConsideredMap] | None = None) -> None:
        self.runs = runs
        self.environments = environments
        self.considered = considered
        self.strings: dict[Any, Any] = {}
        """Each repeated value of the document's entries, once."""
        self.latest = datetime.datetime.now(_UTC) + FUTURE_SLACK
        """The latest ``since`` an entry may carry: a later one is a runner's clock
        ahead, and would win every merge against the truth."""


class _Reading(threading.local):
    tables: _Tables | None = None
    """The tables of the document this thread is decoding."""


_READING = _Reading()


class _TablesLater(Exception):
    """An entry pointed into a table the decoder had not reached yet (a file whose
    tables follow its entries): decode the tables first, then the entries."""


_SHARED_TYPES: dict[str, Any] = {"runs": Run, "environments": Environment,
                                  "considered": ConsideredMap}


def _resolved(value: Any, tables: _Tables | None, table: str) -> Any:
    """The shared object of a reference: row ``value`` of the document's ``table``, or
    the inline object (a file's) or dict (code's) itself."""
    if type(value) is not int:
        if table == "runs":
            return _run_of(value)
        return _interned(_SHARED_TYPES[table], value)
    if tables is None:
        raise ValueError(f"{table} {value} is an index into a file's {table!r} table: "
                         "only an entry read from a file may hold one")
    rows: list[Any] | None = getattr(tables, table)
    if rows is None:
        raise _TablesLater
    if not 0 <= value < len(rows):
        raise ValueError(f"{value} is not an index into {table!r}, which has "
                         f"{len(rows)} rows")
    return rows[value]


def _convert(raw: Any, kind: Any) -> Any:
    """``raw`` as ``kind``; a plain ``ValueError`` (so the decoder adds where it was)."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None


def _read_tables(read: Any, tables: _Tables) -> Any:
    """``read()`` (a decode) with ``tables`` as this thread's document tables."""
    before, _READING.tables = _READING.tables, tables
    try:
        return read()
    finally:
        _READING.tables = before


_NESTED_PATH = re.compile(r" - at `\$([^`]*)` - at `\$([^`]*)`$")


def _message(exc: msgspec.ValidationError) -> str:
    """msgspec's message, one path: a value checked inside a hook reports its path in
    the value, the decoder the value's place in the file."""
    message = _NESTED_PATH.sub(lambda m: f" - at `${m.group(2)}{m.group(1)}`", str(exc))
    return message.replace("got `null`", "got `null` (NaN, infinity or None)")


def _inline(value: Any) -> Any:
    if isinstance(value, FrozenMap):
        return value._items
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


_CANONICAL = msgspec.json.Encoder(enc_hook=_inline, order="sorted")
