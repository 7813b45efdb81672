"""Hostile input shared by the CLI's, the plugin's and the readers' tests: names that
try to forge CI log commands, damaged histograms, JUnit reports made by hand, and the
checks that an error stayed clear and the output safe."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from pytest_arbiter.cli.main import main


def run_cli(*argv: str | Path) -> tuple[int, str, str]:
    """``pytest-arbiter ARGV`` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv], out=out)
    return code, out.getvalue(), err.getvalue()


def assert_clear_error(result: tuple[int, str, str], path: Path, *needles: str) -> None:
    code, out, err = result
    assert code == 2, (out, err)
    assert str(path) in err and "Traceback" not in err and "internal error" not in err, err
    assert "gate passed" not in out
    for needle in needles:
        assert needle in err, err


def assert_safe_output(text: str) -> None:
    """No control character but the line breaks, nothing a terminal or a CI log reads as
    a command."""
    for row in text.splitlines():
        assert row.isprintable(), repr(row)
        assert not row.lstrip().startswith(("::", "##")), repr(row)


def histogram_text(entry: str, tail: str = "") -> str:
    return ('{"entries": [' + entry + '], "schema": "pytest-arbiter/histogram", '
            '"version": 1' + tail + "}")


ENTRY = '{"count": 2, "op": "m", "outcome": "degraded", "selected": "%s", "target": "cpu"}'


DEGRADE = ENTRY % "k"


HOSTILE_JSON = {
    # name: (bytes, what the message says)
    "deep-object": (b'{"a":' * 2000 + b"1" + b"}" * 2000, ""),
    "deep-entries": (histogram_text("[" * 2000 + "]" * 2000).encode(), "$.entries[0]"),
    "lone-surrogate": (histogram_text(ENTRY % "k\\ud800").encode(), "surrogate"),
    "overflow": (histogram_text(DEGRADE.replace('"count": 2', '"count": 1e400')).encode(),
                 "$.entries[0].count"),
    "duplicate-key": (histogram_text(DEGRADE, ', "entries": []').encode(),
                      'the key "entries" appears twice'),
    "duplicate-field": (histogram_text(DEGRADE.replace("}", ', "count": 0}')).encode(),
                        'the key "count" appears twice'),
    "bom": (b"\xef\xbb\xbf" + histogram_text(DEGRADE).encode(), "byte order mark"),
    "utf16": (histogram_text(DEGRADE).encode("utf-16"), "byte order mark"),
    "not-utf8": (histogram_text(ENTRY % "k\xe9").encode("latin-1"), "UTF-8"),
    "unknown-field": (histogram_text(DEGRADE.replace('"count"', '"bount"')).encode(),
                      "unknown field `bount` - at `$.entries[0]`"),
    "missing-field": (histogram_text(DEGRADE.replace('"count": 2, ', "")).encode(),
                      "missing required field `count` - at `$.entries[0]`"),
    "nan": (histogram_text(DEGRADE.replace('"count": 2', '"count": NaN')).encode(), ""),
    "expected-above-count": (histogram_text(DEGRADE.replace("}", ', "expected": 3}'))
                             .encode(), "expected (3) is more than count (2)"),
    "total-mismatch": (histogram_text(DEGRADE, ', "total": {"count": 3, "expected": 0}')
                       .encode(), "total says count 3"),
    "empty-name": (histogram_text(ENTRY % "").encode(), "$.entries[0].selected"),
}


EVIL = "k\n::error file=ci.yml::pwned\x1b[2J\u2028##[group]x"


def suite_xml(cases: str, totals: dict[str, int], marker: bool = True) -> str:
    """A report as the plugin writes it: the suite properties, then the testcases."""
    props = "".join(f'<property name="arbiter-total:{k}" value="{v}"/>'
                    for k, v in totals.items())
    head = '<property name="arbiter-report" value="1"/>' if marker else ""
    return (f'<testsuites><testsuite name="pytest"><properties>{head}{props}</properties>'
            f"{cases}</testsuite></testsuites>")


def case_xml(name: str, **props: int) -> str:
    inner = "".join(f'<property name="{k}" value="{v}"/>' for k, v in props.items())
    return f'<testcase classname="t" name="{name}"><properties>{inner}</properties></testcase>'
