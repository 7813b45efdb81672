"""Parsing a JUnit report's XML safely: UTF-8, no document type, no entity but XML's
five, no network or file access, whichever backend junitparser uses (lxml when it is
installed, else the standard library's ElementTree)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from pytest_arbiter.store.safetext import escape

_ENCODING = re.compile(r"""\sencoding\s*=\s*["']([^"']*)["']""")


def _etree() -> Any:
    """The ElementTree implementation junitparser builds its elements with (lxml when
    it is installed, else the standard library's)."""
    from junitparser import junitparser as backend

    return backend.etree  # type: ignore[attr-defined]


def _check_prolog(text: str, source: str) -> None:
    """Refuse a document type declaration and an encoding other than UTF-8.

    Only the prolog (what comes before the root element) can hold either, so this walks
    the XML declaration, processing instructions, comments and whitespace up to the
    first other markup. Whatever follows is the parser's to judge.
    """
    at, end = 0, len(text)
    while at < end:
        while at < end and text[at] in " \t\r\n":
            at += 1
        if text.startswith("<?", at):
            close = text.find("?>", at)
            if close < 0:
                return
            declared = _ENCODING.search(text, at, close)
            if (text.startswith("<?xml", at) and declared is not None
                    and declared.group(1).lower() not in ("utf-8", "utf8")):
                raise ValueError(f"{escape(source)} declares the encoding "
                                 f"{escape(repr(declared.group(1)))}: a report is UTF-8")
            at = close + 2
        elif text.startswith("<!--", at):
            close = text.find("-->", at + 4)
            if close < 0:
                return
            at = close + 3
        elif text.startswith("<!", at):
            raise ValueError(f"{escape(source)} declares a document type (<!DOCTYPE ...>): "
                             "a JUnit report has no reason to, and its entities could "
                             "expand without bound or read local files")
        else:
            return


def parse_xml(data: bytes, source: str) -> Any:
    """The root element of a report's XML, parsed safely; ``ValueError`` naming
    ``source``. UTF-8 without a byte order mark, no document type, no entity but XML's
    five, no network or file access, by the backend junitparser uses."""
    from pytest_arbiter.store.strictjson import check_bom, position

    check_bom(data, source)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{escape(source)} is not UTF-8: {escape(exc.reason)} at "
                         f"{position(data, exc.start)}") from None
    _check_prolog(text, source)
    etree = _etree()
    try:
        if getattr(etree, "__name__", "").startswith("lxml"):
            parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                                     dtd_validation=False, huge_tree=False)
            root = etree.fromstring(data, parser)
            docinfo = root.getroottree().docinfo
            if docinfo.doctype or docinfo.internalDTD is not None:
                raise _Refused("declares a document type")
        else:
            root = etree.fromstring(data, parser=etree.XMLParser(target=_NoDoctype()))
    except _Refused as exc:
        raise ValueError(f"{escape(source)} {exc}: refused") from None
    except RecursionError:
        raise ValueError(f"{escape(source)} is not valid JUnit XML: nested too deeply"
                         ) from None
    except Exception as exc:  # each backend raises its own syntax error
        raise ValueError(f"{escape(source)} is not valid JUnit XML: {escape(exc)}") from None
    return root


class _Refused(Exception):
    pass


class _NoDoctype(ET.TreeBuilder):
    """The standard library's tree builder, stopping at a document type declaration
    (expat calls this once the declaration is read, before any element)."""

    def doctype(self, name: str, pubid: str | None, system: str | None) -> None:
        raise _Refused("declares a document type")
