"""Headless Chromium for the tests that need a real browser (the ``browser`` marker, `make
test-browser`): Debian's ``chromium`` (``$JAX_ATTENTION_CHROMIUM`` or ``chromium`` on the PATH;
scripts/ensure-chromium installs it) driven by Playwright, with the network off — every host
name but 127.0.0.1 fails to resolve, and a :class:`Visit` refuses and records any request outside
what it was told to allow.
"""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium for the module's tests."""
    from playwright.sync_api import sync_playwright

    executable = os.environ.get("JAX_ATTENTION_CHROMIUM") or shutil.which("chromium")
    if executable is None:
        pytest.fail("no chromium: run scripts/ensure-chromium (make test-browser does)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable,
            args=["--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"])
        yield browser
        browser.close()


class Visit:
    """One page opened in the browser, with what went wrong while it loaded."""

    def __init__(self, browser, server: str):
        """``server``: the URL prefix of what the page may load (``http://127.0.0.1:PORT/``)."""
        self.server = server  # what may be requested: the served site, or one file:// page
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.problems: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda message: message.type == "error" and self.problems.append(
            f"console error: {message.text}"))
        self.page.on("pageerror", lambda error: self.problems.append(f"uncaught: {error}"))
        self.page.on("requestfailed", lambda request: self.problems.append(
            f"request failed: {request.url} ({request.failure})"))
        self.page.on("response", lambda response: response.status >= 400 and self.problems.append(
            f"HTTP {response.status}: {response.url}"))

    def _route(self, route):
        if route.request.url.startswith(self.server) or route.request.url.startswith("data:"):
            route.continue_()
        else:
            self.problems.append(f"request off the site: {route.request.url}")
            route.abort("internetdisconnected")

    def open(self, path: str):
        self.problems.clear()
        self.page.goto(self.server + path, wait_until="load")
        self.page.wait_for_load_state("networkidle")
        return self.page
