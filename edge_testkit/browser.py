"""A real browser for the chat-page tests: Debian's chromium, headless, driven by Selenium
through Debian's chromedriver (never a downloaded driver). `.ci/run` and scripts/test.sh
install both; where they are missing the browser tests skip, saying so."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_testkit import ROOT

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = ROOT / "tests" / "screenshots"
DESKTOP = (1280, 800)
PHONE = (390, 844)

# Offline and quiet: no sync, no updates, no background requests, only loopback traffic.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--window-size={DESKTOP[0]},{DESKTOP[1]}"]


def require_browser() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (Debian packages chromium and "
                    "chromium-driver; scripts/test.sh installs them where apt-get can)")


def chrome(profile: Path) -> Any:
    """A fresh headless chromium with its own profile directory; console messages kept."""
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(100)  # a request in the page, on a busy machine
    return driver


@contextlib.contextmanager
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    driver = chrome(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(check: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def console_errors(driver: Any) -> list[str]:
    """Console errors since the last call (CSP violations and failed loads included)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def open_page(driver: Any, url: str) -> None:
    driver.get(url)
    wait_for(lambda: driver.execute_script("return document.body.dataset.ready === 'true'"),
             30, "the page to set itself up")


def set_viewport(driver: Any, size: tuple[int, int], mobile: bool) -> None:
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": mobile})


def screenshot(driver: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
