"""Untrusted text made safe to print.

Names read from artifacts (ops, candidates, hosts, device tags, test ids, even file
names) end up in CI logs. Printed raw, a line break, a terminal escape or a line that
starts with ``::`` would let whoever wrote a runner's file write into the log of the
job that reads it: forge output, hide lines, or issue GitHub Actions workflow commands.

:func:`escape` replaces every character that is not printable (control characters,
the ESC of ANSI sequences, line and paragraph separators, bidi and other format
characters, lone surrogates, spaces other than the ASCII one) by a Python-style escape
(``\\x1b``, ``\\n``, ``\\u2028``); :func:`line` also defuses a line that would start a
CI log command (``::`` for GitHub Actions, ``##`` for Azure Pipelines and TeamCity).
Both are idempotent, so text escaped at its source may pass through them again.
The result is for display, not a reversible encoding: a backslash is left as it is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["counted", "escape", "line", "lines", "printable"]

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_COMMAND_STARTS = ("::", "##")


def _escaped(ch: str) -> str:
    short = _SHORT.get(ch)
    if short is not None:
        return short
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape(text: object) -> str:
    """``str(text)`` with every non-printable character escaped (one line, no control
    characters, no surrogates)."""
    s = str(text)
    if s.isprintable():  # one C loop: the common case costs nothing more
        return s
    return "".join(ch if ch.isprintable() else _escaped(ch) for ch in s)


def line(text: object) -> str:
    """:func:`escape`, and a first character escaped where the line would otherwise start
    a CI log command (``::error::...``, ``##[group]``, ``##vso[...]``)."""
    s = escape(text)
    stripped = s.lstrip(" ")
    if stripped.startswith(_COMMAND_STARTS):
        at = len(s) - len(stripped)
        return s[:at] + _escaped(s[at]) + s[at + 1:]
    return s


_COMMAND_LINE = re.compile(r"^ *(?:::|##)", re.MULTILINE)
_ASCII_CONTROLS = bytes(range(0x20)) + b"\x7f"


def printable(text: str) -> bool:
    """``text.isprintable()``; ASCII text (the common case) by C loops that take a byte
    at a time, not a character's properties (a third of the time on long text)."""
    if text.isascii():
        data = text.encode("ascii")
        return len(data.translate(None, _ASCII_CONTROLS)) == len(data)
    return text.isprintable()


def lines(texts: Sequence[str]) -> str:
    """Each of ``texts`` as :func:`line` makes it, each ended by a line break: checked
    together, in C, and one by one only when the whole has something to escape."""
    joined = "".join(texts)
    if printable(joined):
        text = "\n".join(texts) + "\n" if texts else ""
        # a workflow command needs "::" or "##": two C searches spare the line scan
        if ("::" not in text and "##" not in text) or _COMMAND_LINE.search(text) is None:
            return text
    return "".join(line(t) + "\n" for t in texts)


def counted(count: int, noun: str, many: str | None = None) -> str:
    """``1 dispatch``, ``2 dispatches``: ``count`` and its noun, plural past one (``many``
    when the plural is not the noun and an ``s``)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"
