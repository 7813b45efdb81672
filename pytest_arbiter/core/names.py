"""The names an op or a candidate may have.

A name travels into file names' neighbours, JSON keys, JUnit property names
(``arbiter:TARGET/OP/CANDIDATE/OUTCOME``) and CI logs, so it is kept to characters every
one of them takes as they are: letters, digits, ``_``, ``.``, ``+`` and ``-``, starting
with a letter, a digit or ``_``, at most 128 of them. Anything else (a ``/`` that would
split a JUnit property, an escape byte that would forge a log line, a space) is refused
at registration with the rule, not discovered later by a reader that cannot parse it.
"""

from __future__ import annotations

import re

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")


def check_name(what: str, name: object) -> str:
    """``name`` if it follows the rule above, else a ``ValueError`` naming ``what``."""
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise ValueError(
            f"{what} name {name!r} is not allowed: use letters, digits, '_', '.', '+' and "
            "'-' (starting with a letter, digit or '_'; at most 128 characters)")
    return name
