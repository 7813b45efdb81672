"""``python -m pytest_arbiter``: the ``pytest-arbiter`` console script, for an
environment whose scripts folder is not on ``PATH``."""

from __future__ import annotations

import sys

from pytest_arbiter.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
