"""Helpers of the view's tests: a `courtly` process that serves its view, and headless Chromium.

Chromium is Debian's `chromium` package (/usr/bin/chromium; .ci/run installs it), driven by
Playwright for Python; no browser is downloaded. Screenshots are kept in test-artifacts/
(COURTLY_TEST_ARTIFACTS), which git ignores.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import courtly_process

CHROMIUM = os.environ.get("COURTLY_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
ARTIFACTS = Path(os.environ.get("COURTLY_TEST_ARTIFACTS",
                                Path(__file__).resolve().parent.parent / "test-artifacts"))
_SERVING = re.compile(r"courtly: serving .* at (http://\S+/) \(read-only\)")


class Served:
    """A running `courtly` process serving its view: its URL and everything it printed."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.url = ""
        self._found = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            match = _SERVING.search(line)
            if match and not self.url:
                self.url = match.group(1)
                self._found.set()
        self._found.set()  # the process ended

    def wait_url(self, timeout: float = 60) -> str:
        assert self._found.wait(timeout), "the view was not served in time"
        assert self.url, "".join(self.lines)
        return self.url

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return bytes(response.read())

    def json(self, path: str) -> Any:
        return json.loads(self.get(path))

    def metrics(self) -> dict[str, Any]:
        """/metrics parsed by prometheus_client: family name → family."""
        text = self.get("metrics").decode()
        return {family.name: family for family in text_string_to_metric_families(text)}

    def stop(self) -> str:
        """SIGTERM, wait, and return what it printed."""
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(60)
        self._reader.join(10)
        return "".join(self.lines)


@contextmanager
def serving(*args: Any, env: dict[str, str] | None = None) -> Iterator[Served]:
    """Start `courtly ARGS` (which serves a view), stopped at the end."""
    served = Served(courtly_process(*map(str, args), env=env))
    try:
        served.wait_url()
        yield served
    finally:
        served.stop()


def until(condition: Any, timeout: float = 30, message: str = "") -> Any:
    """Poll `condition()` until it returns something true; its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, message or "condition not met in time"
        time.sleep(0.1)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Debian's) driven by Playwright: yields a new page factory."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), (
        f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page: Any, name: str) -> Path:
    """Keep a screenshot of the page as a test artifact."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path
