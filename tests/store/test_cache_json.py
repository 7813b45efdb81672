"""``show --json``'s text, made by msgspec a chunk of entries at a time, is the text
``json.dumps(indent=2, sort_keys=True)`` gives of the entries' ``to_dict`` form, for
entries of any shape."""

from __future__ import annotations

import datetime
import json

from hypothesis import given, settings, strategies as st

from pytest_arbiter.store.cache import CacheEntry, RankedCandidate
from pytest_arbiter.store.cache_json import json_chunks
from pytest_arbiter.timing.measure import LatencyStats

_NUMBERS = st.one_of(st.integers(0, 2**63 - 1), st.floats(0.0, 1e300),
                     st.sampled_from([0.0, -0.0, 1e-5, 5e-5, 1e-4, 9.99e-5, 1e16, 1.5e16, 1e300]))
_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1,
                max_size=6)


@st.composite
def _entries(draw: st.DrawFn) -> CacheEntry:
    """An entry with latencies, ratios, confidences and p-values Python writes with an
    exponent, names past ASCII, a provenance of any keys, ``since`` or none."""
    count = draw(st.integers(1, 3))
    names = draw(st.lists(_TEXT, min_size=count, max_size=count, unique=True))
    rows = []
    for place, name in enumerate(names):
        values = sorted(draw(st.lists(_NUMBERS, min_size=5, max_size=5)))
        if not values[-1]:
            values[-1] = 1
        ratio = None if place == 0 else draw(st.one_of(
            st.none(), st.floats(1e-9, 1e9), st.sampled_from([1e-5, 5e-5])))
        low, q1, median, q3, top = values
        rows.append(RankedCandidate(name, LatencyStats(median, low, q1, q3, top, 3),
                                    ratio=ratio))
    own = {"p_value": st.one_of(st.floats(0.0, 1.0), st.sampled_from([1e-5, 0.0, 1.0])),
           "rounds": st.integers(0, 99), "shapes": st.sampled_from([[], [[]], [[2, 3], [4]]]),
           "measured_at": st.just("2026-12-03T06:00:00Z"), "timed_alone": st.booleans(),
           "host": _TEXT, "device_name": _TEXT, "versions": st.dictionaries(_TEXT, _TEXT)}
    provenance = {key: draw(value) for key, value in own.items() if draw(st.booleans())}
    since = draw(st.one_of(st.none(), st.just(datetime.datetime(
        2026, 1, 1, tzinfo=datetime.timezone.utc))))
    return CacheEntry(draw(_TEXT), "cpu", draw(_TEXT), draw(_TEXT), "float32", tuple(rows),
                      draw(st.one_of(st.floats(0.0, 1.0), st.sampled_from([1e-5, -0.0]))),
                      draw(st.booleans()), draw(st.dictionaries(_TEXT, _TEXT, max_size=2)),
                      provenance, {}, draw(st.dictionaries(_TEXT, _TEXT, max_size=2)),
                      draw(st.booleans()), **({} if since is None else {"since": since}))


@settings(max_examples=100, deadline=None)
@given(st.lists(_entries(), max_size=5))
def test_generated_entries_json_is_json_dumps_of_their_dicts(entries: list[CacheEntry]
                                                             ) -> None:
    text = b"".join(json_chunks(entries)).decode("ascii")
    assert text == json.dumps([e.to_dict() for e in entries], indent=2, sort_keys=True,
                              allow_nan=False) + "\n"
