"""Open a report page in Debian's headless chromium through selenium (chromium-driver), or skip.

CI installs the browser with `apt-get install -y chromium chromium-driver`; selenium is in the
`test` extra. Nothing is downloaded: the driver path is given, so Selenium Manager stays idle.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest


def chromium_paths() -> tuple[str, str]:
    """(browser, driver) executables, or skip the test when either is missing."""
    pytest.importorskip("selenium")
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("chromium and chromium-driver are not installed (apt-get install -y chromium chromium-driver)")
    return browser, driver


def start_chromium(width: int = 1300, height: int = 2400):
    """A headless chromium driven by chromedriver (a selenium WebDriver), or skip when either is missing."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = chromium_paths()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-default-apps", "--disable-sync"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    web = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
    web.set_page_load_timeout(60)
    return web


class Page:
    """A loaded page: screenshot, console messages, network requests, and a JS evaluator.

    With `driver` (from `start_chromium`) the page opens in that browser, which stays open after
    `close()`; the console and network logs it reports start at this page. Without, the page
    starts a browser of its own and `close()` quits it."""

    def __init__(self, path: Path, driver=None):
        self.owned = driver is None
        self.driver = start_chromium() if driver is None else driver
        if not self.owned:  # drop what earlier pages logged: each page reports only its own messages
            self.driver.get_log("browser")
            self.driver.get_log("performance")
        self.driver.get(Path(path).resolve().as_uri())
        # Plotly draws synchronously on load; wait until every graph div has its SVG.
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(self.driver, 30).until(lambda d: d.execute_script(
            "return document.readyState === 'complete' && Array.from(document.querySelectorAll("
            "'.plotly-graph-div')).every(g => g.querySelector('.main-svg'))"))

    def js(self, script: str):
        return self.driver.execute_script(script)

    def screenshot(self, out: Path) -> Path:
        self.driver.save_screenshot(str(out))
        return out

    def console_errors(self) -> list[str]:
        return [m["message"] for m in self.driver.get_log("browser") if m["level"] in ("SEVERE", "ERROR")]

    def requested_urls(self) -> list[str]:
        urls = []
        for entry in self.driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg.get("method") == "Network.requestWillBeSent":
                urls.append(msg["params"]["request"]["url"])
        return urls

    def close(self) -> None:
        if self.owned:
            self.driver.quit()
        else:  # a blank page: nothing of this one runs on in the shared browser
            self.driver.get("about:blank")
