"""JSON as an artifact may hold it (``strictjson``): no byte order mark, no key twice,
no nesting past ``MAX_DEPTH``, and errors that name the source, the line and the column.

The depth guard counts levels itself, the same limit on every Python: 3.11's parsers
raise ``RecursionError`` near 1000 levels, 3.13's take thousands. Brackets inside strings
(escaped quotes and backslashes around them) never count.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.store import artifacts, strictjson
from pytest_arbiter.store.strictjson import MAX_DEPTH, check_depth


def nested(depth: int, kind: str = "mixed") -> str:
    """``depth`` levels of arrays, objects or both alternating, around a number."""
    text = "1"
    for level in range(depth):
        as_object = kind == "object" or (kind == "mixed" and level % 2 == 1)
        text = '{"k[":' + text + "}" if as_object else "[" + text + "]"
    return text


@pytest.mark.parametrize("kind", ["array", "object", "mixed"])
def test_the_limit_is_exact_for_every_kind_of_nesting(kind: str) -> None:
    artifacts.parse_json(nested(MAX_DEPTH, kind), "src")
    for depth in (MAX_DEPTH + 1, 200, 900, 3000):
        with pytest.raises(ArtifactError,
                           match=rf"src is nested too deeply \(more than {MAX_DEPTH} levels"):
            artifacts.parse_json(nested(depth, kind), "src")


def test_brackets_in_strings_do_not_count() -> None:
    opened = "[" * 300 + "{" * 300
    for text in (json.dumps([opened, opened + '"\\', {opened: "]" * 300}]),
                 json.dumps(["\\", opened, "\\\\" + opened + "\\"]),
                 json.dumps({"": "", "a": ["", opened, ""], opened: ""}),
                 '["\\u005b' + opened + '\\""]'):
        assert strictjson.decode(text.encode(), "src") == json.loads(text)
        # wrapped to the limit it passes, one level more is refused
        room = MAX_DEPTH - _depth(json.loads(text))
        wrapped = "[" * room + text + "]" * room
        strictjson.decode(wrapped.encode(), "src")
        with pytest.raises(ValueError, match="nested too deeply"):
            strictjson.decode(b"[" + wrapped.encode() + b"]", "src")


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def _document(rng: random.Random, depth: int) -> Any:
    """A random document exactly ``depth`` deep, its strings full of brackets,
    quotes and backslashes."""
    def text() -> str:
        return "".join(rng.choice('[]{}"\\ax\u00e9') for _ in range(rng.randrange(6)))

    if depth == 0:
        return rng.choice([text(), 1, None, 2.5, True])
    deep = _document(rng, depth - 1)
    others = [_document(rng, rng.randrange(depth)) for _ in range(rng.randrange(3))]
    items = [*others, deep]
    rng.shuffle(items)
    if rng.random() < 0.5:
        return items
    return {f"{text()}{i}": item for i, item in enumerate(items)}


def test_the_count_agrees_with_the_parsed_depth() -> None:
    rng = random.Random(7)
    for _ in range(300):
        doc = _document(rng, rng.randrange(1, 12))
        depth = _depth(doc)
        data = json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode()
        check_depth(data, "src", limit=depth)
        if depth > 1:
            with pytest.raises(ValueError, match="nested too deeply"):
                check_depth(data, "src", limit=depth - 1)


def test_parse_json_refuses_what_json_loads_accepts() -> None:
    # nesting is refused past MAX_DEPTH on every Python: 200 levels is within 3.11's
    # recursion limit, and 3.13's parsers take 3000 without a RecursionError
    for text in ('{"a": 1, "a": 2}', "[1e400]", "[-1e400]", '["\\ud800"]', "NaN",
                 "[" * 3000 + "]" * 3000, "[" * 200 + "]" * 200, '{"a":' * 200 + "1" + "}" * 200):
        with pytest.raises(ArtifactError, match="src"):
            artifacts.parse_json(text, "src")


def test_decode_refuses_a_byte_order_mark_naming_the_source() -> None:
    with pytest.raises(ValueError, match=r"^src starts with a UTF-8 byte order mark"):
        strictjson.decode(b"\xef\xbb\xbf{}", "src")


def test_decode_refuses_a_key_given_twice() -> None:
    with pytest.raises(ValueError, match=r'src: the key "a" appears twice in one object'):
        strictjson.decode(b'{"b": {"a": 1, "a": 2}}', "src")
    assert strictjson.decode(b'{"a": {"a": 1}}', "src") == {"a": {"a": 1}}


def test_a_syntax_error_says_the_line_and_column() -> None:
    with pytest.raises(ValueError, match=r"^src is not valid JSON: .* at line 2, column 8 "
                                         r"\(byte 16\)"):
        strictjson.decode(b'{"a": 1,\n"b": 2,}', "src")
    assert strictjson.position(b"ab\ncd", 4) == "line 2, column 2 (byte 4)"


def test_a_lone_surrogate_is_named_not_called_truncated() -> None:
    with pytest.raises(ValueError, match=r"lone UTF-16 surrogate escape at line 1, column 3 "
                                         r"\(byte 2\)"):
        strictjson.decode(b'["\\ud800"]', "src")


def test_a_value_of_the_wrong_type_names_the_source_and_the_path() -> None:
    with pytest.raises(ValueError, match=r"^src: Expected `int`, got `str` - at `\$\[1\]`"):
        strictjson.decode(b'[1, "2"]', "src", list[int])
