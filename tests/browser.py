"""Headless Chromium (Debian's) through Playwright, for the UI tests: a browser context that can
reach 127.0.0.1 only; any other request is aborted and reported as a failure."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")


@contextmanager
def local_browser(profile_dir: Path, what: str) -> Iterator:
    """A Playwright browser context on ``profile_dir``; on exit, AssertionError if ``what`` (the
    page under test) tried to reach anything outside 127.0.0.1."""
    from playwright.sync_api import sync_playwright

    blocked: list[str] = []

    def only_local(route):  # nothing may leave the machine
        if route.request.url.startswith(("http://127.0.0.1", "data:", "blob:")):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile_dir), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 900},
        )
        context.route("**/*", only_local)
        try:
            yield context
        finally:
            context.close()
    assert blocked == [], f"{what} tried to reach outside 127.0.0.1: {blocked[:5]}"
