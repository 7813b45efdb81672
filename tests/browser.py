"""A real browser for the pages people look at: Debian's Chromium, driven by playwright.

``needs_chromium`` skips a test where Chromium is not installed (``.ci/run`` installs it:
``apt-get install chromium``); :func:`chromium_page` opens one page at a viewport and
closes the browser whatever the test does."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (.ci/run installs it: apt-get "
    "install chromium)")


@contextlib.contextmanager
def chromium_page(width: int, height: int) -> Iterator[Any]:
    """A page of a headless Chromium at ``width`` x ``height`` (skips the test when
    playwright is not installed)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM,
                                     args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()
