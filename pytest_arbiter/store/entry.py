"""One cache entry: the measured pick for a key (:class:`CacheEntry`), its ranking
(:class:`RankedCandidate`) and who measured it (:class:`Provenance`).

The classes are the cache format's documentation and its validation: a cache file is
decoded by msgspec straight into them (:mod:`pytest_arbiter.store.cache_file`), in one pass
that checks every type and bound and names the JSON path of a bad value
(``$.entries[3].ranking[0].stats.samples``); unknown fields, NaN, infinities and
out-of-range numbers are refused. An entry built in code is checked the same way when
it is built.

Every struct is frozen and untracked by the garbage collector (``gc=False``): a loaded
corpus of a million entries leaves the collector almost nothing to walk. What many
entries share is read into the shared maps of :mod:`pytest_arbiter.store.tables`.
docs/artifacts.md describes the file.
"""

from __future__ import annotations

import datetime
import operator
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType
from msgspec.structs import force_setattr

from pytest_arbiter.store.tables import (
    _CANONICAL,
    _READING,
    _SHARED_TYPES,
    _UTC,
    NO_CONSIDERED,
    NO_ENVIRONMENT,
    NO_REASONS,
    NO_RUN,
    Considered,
    ConsideredMap,
    Count,
    Name,
    Probability,
    Reasons,
    Run,
    Since,
    Versions,
    _convert,
    _inline,
    _interned,
    _message,
    _read_tables,
    _resolved,
    _RunRow,
    _sorted_dict,
    _sorted_items,
    _Tables,
)
from pytest_arbiter.timing.measure import LatencyStats


class CacheKey(NamedTuple):
    """What one cache entry serves. A plain 5-tuple in this order finds the same entry."""

    device: str
    """The device tag (``sm_120``, ``gfx1151``, a CPU model tag)."""
    target: str
    op: str
    bucket: str
    """The shape bucket (:meth:`pytest_arbiter.core.regions.Region.bucket`)."""
    dtype: str


KeyTuple = tuple[str, str, str, str, str]
"""A :class:`CacheKey`'s values as a plain tuple: what a cache's table is keyed by. The
garbage collector stops tracking exact tuples of strings, not named ones, and a loaded
corpus holds a key per entry."""

plain_key: Callable[[CacheEntry], KeyTuple] = attrgetter(
    "device", "target", "op", "bucket", "dtype")
"""An entry's key as a :data:`KeyTuple` (one C call)."""


CONFIDENT = 0.99
"""An entry at or above this confidence (and not a tie) is a clear pick; two clear picks
of different winners for one key, measured against the same code and environment, are
a merge conflict."""


MIN_ROUNDS = 7
"""Fewer timed rounds than this behind a pick of two or more candidates is too little
evidence for any claim: the entry is low-confidence whatever its p-value."""


NO_SINCE = datetime.datetime(1970, 1, 1, tzinfo=_UTC)
"""The ``since`` of an entry that does not know what it was measured against (one built
without it): older than any measurement."""


if TYPE_CHECKING:  # what code reads and passes: after finish_read the shared types
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


MAX_RATIO = 1e9
"""The largest paired ratio a row may claim (a JSON number past it is a forged file)."""

if TYPE_CHECKING:
    _Ratio = float
else:
    _Ratio = Annotated[float, Meta(gt=0.0, le=MAX_RATIO)]


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
    ratio: _Ratio | None = None
    """Its paired ratio to the winner in the entry's latest comparison: the median, over
    the rounds both were timed in, of its time over the winner's (1.0 for the winner).
    What ranked it; its own median can disagree. ``None`` on a carried row."""

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, **self.stats.to_dict(), "carried": self.carried}
        if self.ratio is not None:
            out["ratio"] = self.ratio
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankedCandidate:
        ratio = data.get("ratio")
        return cls(str(data["name"]), LatencyStats.from_dict(data),
                   bool(data.get("carried", False)),
                   None if ratio is None else float(ratio))


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
        hand-written entries give); ``ValueError`` for another key."""
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
    if row.carried and row.ratio is not None:
        raise ValueError(f"ranking row {row.name!r}: a carried row has no paired ratio "
                         f"(it was not timed with the winner); got ratio {row.ratio}")


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
        # Decoding (a file, a payload, an entry built in code being checked): the common
        # case here, while the new entry is in the processor's cache (a pass over all
        # the entries afterwards costs more: it fetches each again); anything else
        # (an inline object, a default, a bad index, a table not read yet, a ``since``
        # not in UTC or in the future, an impossible row) is left to finish_read, with
        # every field as read (the tables may hold another file's row numbers, which
        # must not be looked up twice).
        prov = self.provenance
        try:
            run = tables.runs[prov.run]  # type: ignore[index, call-overload]
            environment = tables.environments[self.environment]  # type: ignore[index, call-overload]
            considered = tables.considered[self.considered]  # type: ignore[index, call-overload]
        except (TypeError, IndexError):
            tables.pending.append(self)
            return
        since = self.since
        if since.tzinfo is not _UTC or since > tables.latest:
            tables.pending.append(self)
            return
        # one object for each repeated value of the document: a million entries of a few
        # devices, ops and candidates hold a few strings, not several million (not for
        # a block of entries read and let go: :attr:`_Tables.strings` is ``None``)
        strings = tables.strings
        one = None if strings is None else strings.setdefault
        for row in self.ranking:
            if one is not None:
                force_setattr(row, "name", one(row.name, row.name))
            st = row.stats
            if not (0 < st.max_ns and st.min_ns <= st.q1_ns <= st.median_ns <= st.q3_ns
                    <= st.max_ns) or (row.carried and row.ratio is not None):
                tables.pending.append(self)
                return
        force_setattr(prov, "run", run)
        force_setattr(self, "environment", environment)
        force_setattr(self, "considered", considered)
        if type(self.rejected) is not Reasons:
            force_setattr(self, "rejected", _interned(Reasons, self.rejected))
        if one is not None:
            force_setattr(self, "since", one(since, since))
            force_setattr(self, "device", one(self.device, self.device))
            force_setattr(self, "target", one(self.target, self.target))
            force_setattr(self, "op", one(self.op, self.op))
            force_setattr(self, "dtype", one(self.dtype, self.dtype))

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
            tables = _Tables()
            checked = _read_tables(lambda: msgspec.convert(raw, CacheEntry), tables)
            finish_read([checked], tables)
        except BadEntry as exc:
            raise ValueError(f"cache entry {'/'.join(map(str, self.key))}: {exc.detail}"
                             ) from None
        except (TypeError, ValueError, msgspec.ValidationError) as exc:
            message = _message(exc) if isinstance(exc, msgspec.ValidationError) else exc
            raise ValueError(f"cache entry {'/'.join(map(str, self.key))}: {message}"
                             ) from None
        for name in self.__struct_fields__:
            force_setattr(self, name, getattr(checked, name))
        force_setattr(self, "ranking", tuple(
            RankedCandidate(r.name, r.stats.whole(), r.carried, r.ratio) for r in self.ranking))

    @property
    def key(self) -> CacheKey:
        return CacheKey(self.device, self.target, self.op, self.bucket, self.dtype)

    @property
    def winner(self) -> str:
        return self.ranking[0].name

    def over_winner(self, row: RankedCandidate) -> float | None:
        """How many times slower than the winner ``row`` was, as ranked: its paired ratio
        (a row of a file without one: its median over the winner's); ``None`` for a
        carried row, which was not timed with the winner."""
        if row.carried:
            return None
        if row.ratio is not None:
            return row.ratio
        best = self.ranking[0].stats.median_ns
        return row.stats.median_ns / best if best > 0 else None

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
        ranking = self.ranking
        if len(ranking) < 2 or ((ranking[0].carried or ranking[1].carried)  # else two timed
                                and list(map(_CARRIED, ranking)).count(False) < 2):
            return False
        rounds = self.provenance.rounds
        if isinstance(rounds, int) and rounds < MIN_ROUNDS:
            return True
        return not self.tie and self.confidence < CONFIDENT

    @property
    def timed_count(self) -> int:
        """How many of the key's candidates were timed for it (its ``timed`` rows; the
        ranking's length for an entry that does not say)."""
        considered = self.considered
        if not considered:
            return len(self.ranking)
        if type(considered) is ConsideredMap:
            return considered.timed
        return list(map(_OUTCOME, considered.values())).count("timed")  # C loops

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


class BadEntry(ValueError):
    """Entry ``index`` of a decoded list is impossible: ``detail`` says why, ``at`` where
    inside the entry (``.provenance.run``, ``.ranking[1]``, or nothing)."""

    def __init__(self, index: int, detail: str, at: str = "") -> None:
        super().__init__(f"{detail} - at `$[{index}]{at}`")
        self.index, self.detail, self.at = index, detail, at

    def path(self, prefix: str = "$.entries") -> str:
        """What is wrong and where, the entry a JSON path under ``prefix``."""
        return f"{self.detail} - at `{prefix}[{self.index}]{self.at}`"


_PROVENANCE = attrgetter("provenance")
_CARRIED = attrgetter("carried")
_OUTCOME = attrgetter("outcome")
_SHARED_FIELDS = ((_PROVENANCE, "run", "runs", ".provenance.run"),
                  (None, "environment", "environments", ".environment"),
                  (None, "considered", "considered", ".considered"))


def finish_read(entries: list[CacheEntry], tables: _Tables) -> None:
    """What the decode of ``entries`` left to do: each entry's ``__post_init__`` does the
    common case and leaves the rest (``tables.pending``) to this pass over those entries
    alone, once every table is read: inline objects and defaults become the shared
    rows, ``since`` goes to UTC, and an impossible entry is a :class:`BadEntry` naming
    it (a bad table index, a ``since`` in the future, an impossible ranking row)."""
    pending, tables.pending = tables.pending, []
    if not pending:
        return
    try:
        _finish_pending(pending, tables)
    except BadEntry as exc:
        bad = pending[exc.index]
        index = next(i for i, entry in enumerate(entries) if entry is bad)
        raise BadEntry(index, exc.detail, exc.at) from None


def _finish_pending(entries: list[CacheEntry], tables: _Tables) -> None:
    for holder, name, table, at in _SHARED_FIELDS:
        objects = entries if holder is None else list(map(holder, entries))
        _set_all(objects, name, _shared(list(map(attrgetter(name), objects)),
                                        getattr(tables, table) or [], table, at))
    reasons = list(map(attrgetter("rejected"), entries))
    if any(map(operator.is_not, map(type, reasons), repeat(Reasons))):
        _set_all(entries, "rejected", [r if type(r) is Reasons else _interned(Reasons, r)
                                       for r in reasons])
    _finish_since(entries, tables)
    for index, entry in enumerate(entries):
        for place, row in enumerate(entry.ranking):
            try:
                _check_row(row)
            except ValueError as exc:
                raise BadEntry(index, str(exc), f".ranking[{place}]") from None


def _set_all(objects: list[Any], name: str, values: list[Any]) -> None:
    deque(map(force_setattr, objects, repeat(name), values), maxlen=0)


def _shared(values: list[Any], rows: list[Any], table: str, at: str) -> list[Any]:
    """The shared rows of ``values``: indices into ``rows`` (the common case, one C
    loop), inline objects or what an entry built in code holds."""
    try:
        return list(map(rows.__getitem__, values))
    except (IndexError, TypeError):
        pass
    kind = _SHARED_TYPES[table]
    out = []
    for index, value in enumerate(values):
        if type(value) is kind:
            out.append(value)
        elif type(value) is not int:
            out.append(_resolved(value, table))
        elif value < len(rows):
            out.append(rows[value])
        else:
            raise BadEntry(index, f"{value} is not an index into {table!r}, which has "
                           f"{len(rows)} rows", at)
    return out


def _finish_since(entries: list[CacheEntry], tables: _Tables) -> None:
    """Every ``since`` in UTC (as written and compared) and none in the future."""
    read = list(map(attrgetter("since"), entries))
    sinces = None
    if set(map(attrgetter("tzinfo"), read)) != {_UTC}:
        read = sinces = [s if s.tzinfo is _UTC else s.astimezone(_UTC) for s in read]
    if max(read) > tables.latest:
        index = next(i for i, since in enumerate(read) if since > tables.latest)
        raise BadEntry(index, f"since {read[index]:%Y-%m-%dT%H:%M:%SZ} is in the future "
                       "(this machine's clock says it is earlier): the runner that "
                       "measured it has a clock ahead; fix its clock and measure the key "
                       "again", ".since")
    if sinces is not None:
        _set_all(entries, "since", sinces)


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
