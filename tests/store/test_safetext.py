"""Untrusted text made safe to print: ``escape`` leaves printable text alone and makes
everything else visible, ``line`` defuses CI log commands."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from pytest_arbiter.store import safetext
from pytest_arbiter.store.safetext import escape, line, printable


def test_escape_leaves_printable_text_alone() -> None:
    for text in ("cutlass::gemm_16x8", "tests/test_a.py::test_b[1-x]", "é 数 ∑", "a\\nb"):
        assert escape(text) == text and line(text) == text


def test_escape_replaces_what_is_not_printable() -> None:
    hostile = "a\x1b[31mb\nc\rd\te\x85f\x9bg\u2028h\u202ei\u200bj\ud800k\U000e0001\xa0"
    assert escape(hostile) == (
        "a\\x1b[31mb\\nc\\rd\\te\\x85f\\x9bg\\u2028h\\u202ei\\u200bj\\ud800k\\U000e0001\\xa0")
    assert escape(escape(hostile)) == escape(hostile)


def test_line_defuses_ci_log_commands() -> None:
    assert line("::error file=a::pwned") == "\\x3a:error file=a::pwned"
    assert line("   ##[group]x") == "   \\x23#[group]x"
    assert line("##vso[task.setvariable]") == "\\x23#vso[task.setvariable]"
    assert line("\n::warning::x") == "\\n::warning::x"
    assert line("ns::kernel") == "ns::kernel"
    assert line(line("::x")) == line("::x")


def test_escape_takes_any_object_and_escapes_its_text() -> None:
    assert escape(ValueError("bad\nname")) == "bad\\nname"
    assert escape(3) == "3"
    assert escape("\x00") == "\\x00" and escape("\U0001f600") == "\U0001f600"


def test_line_escapes_only_the_first_character_of_a_command_after_spaces() -> None:
    assert line("  ::group::x") == "  \\x3a:group::x"
    assert line("a ::x") == "a ::x" and line("#x") == "#x"
    # an escaped line break cannot start a command on the next line either
    assert "\n" not in line("ok\n::error::x")


@pytest.mark.parametrize("texts", [
    [], ["a", "b"], ["::error::x", "b"], ["ok", "  ##vso[task]"], ["a\nb", "c"],
    ["a\x1b[31m", "b"], ["x::y", "z##"], ["\u202e", "::"], ["", " "],
])
def test_lines_say_each_text_as_line_does(texts: list[str]) -> None:
    """Many lines checked at once (one C pass when nothing needs escaping) give what
    :func:`line` gives each one, a line break after each."""
    assert safetext.lines(texts) == "".join(safetext.line(t) + "\n" for t in texts)


@given(st.text(st.characters(codec="utf-8", exclude_categories=["Cs"])))
def test_printable_is_isprintable(text: str) -> None:
    """The byte-wise check of ASCII text says what ``str.isprintable`` says, and so of
    every character below 0x80 (DEL and the controls, next to printable ones)."""
    assert printable(text) is text.isprintable()
    for code in range(0x80):
        assert printable(f"a{chr(code)}b") is f"a{chr(code)}b".isprintable()
