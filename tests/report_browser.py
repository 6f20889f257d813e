"""Open a report in headless Chromium (Debian's ``chromium`` and ``chromium-driver``) through
Selenium: how long its charts take to draw, what JavaScript errors it raised, a screenshot.

Shared by the browser tests (``tests/test_report_browser.py``) and the load benchmark
(``benchmarks/report_load.py``). ``available()`` says why it cannot run, so a test can say so
(``conftest.require``: a skip, or a failure under CI=true).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# For a machine with a closed network and no display: no first-run, sync or component-update
# traffic (each would be refused, many times over), no sandbox (CI runs as root), no GPU.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-quic", "--disable-dev-shm-usage", "--hide-scrollbars",
)  # fmt: skip

# Installed before any script of the page runs: uncaught errors and rejected promises are
# counted even if the console log misses them.
_CATCH_ERRORS = """
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });
window.addEventListener('unhandledrejection', function (e) {
  window.__errors.push('unhandled rejection: ' + String(e.reason)); });
"""


def _executables() -> tuple[str | None, str | None]:
    return (shutil.which("chromium") or shutil.which("chromium-browser"),
            shutil.which("chromedriver"))


def available() -> str | None:
    """``None`` when a report can be opened here, else the reason it cannot."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    chromium, driver = _executables()
    if chromium is None:
        return "chromium is not installed (apt-get install chromium chromium-driver)"
    if driver is None:
        return "chromedriver is not installed (apt-get install chromium-driver)"
    return None


@dataclass
class PageLoad:
    """What opening one page showed."""

    ready: bool
    open_s: float  # wall time from the request to every chart drawn
    charts_ready_ms: float | None  # the page's own clock: navigation start to charts drawn
    errors: list[str] = field(default_factory=list)
    charts: dict[str, dict[str, Any]] = field(default_factory=dict)


class HeadlessChromium:
    """One browser for many pages: ``with HeadlessChromium() as browser: browser.open(path)``."""

    def __init__(self, *, width: int = 1280, height: int = 1400) -> None:
        reason = available()
        if reason:
            raise RuntimeError(reason)
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        chromium, driver = _executables()
        self._profile = tempfile.mkdtemp(prefix="autoplace-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={self._profile}")
        options.add_argument(f"--window-size={width},{height}")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.size = (width, height)
        try:
            self.driver = webdriver.Chrome(service=Service(executable_path=driver),
                                           options=options)
        except Exception:
            shutil.rmtree(self._profile, ignore_errors=True)
            raise
        self.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                                    {"source": _CATCH_ERRORS})

    def __enter__(self) -> HeadlessChromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self._profile, ignore_errors=True)

    def open(self, page: str | Path, *, timeout_s: float = 30.0) -> PageLoad:
        """Load ``page`` and wait until its charts are drawn (``body[data-charts=ready]``)."""
        driver = self.driver
        driver.set_window_size(*self.size)
        driver.get_log("browser")  # drop what an earlier page logged
        began = time.perf_counter()
        driver.get(Path(page).resolve().as_uri())
        ready = False
        while time.perf_counter() - began < timeout_s:
            if driver.execute_script("return document.body && document.body.dataset.charts"):
                ready = True
                break
            time.sleep(0.01)
        open_s = time.perf_counter() - began
        errors = list(driver.execute_script("return window.__errors || []"))
        errors += [entry["message"] for entry in driver.get_log("browser")
                   if entry.get("level") == "SEVERE"]
        charts = driver.execute_script("""
            var out = {};
            document.querySelectorAll('.chart').forEach(function (div) {
              out[div.id] = {
                plotly: div.classList.contains('js-plotly-plot'),
                svgs: div.querySelectorAll('svg.main-svg').length,
                bars: div.querySelectorAll('.barlayer .point').length,
                lines: div.querySelectorAll('.scatterlayer .trace').length,
                width: div.getBoundingClientRect().width,
                height: div.getBoundingClientRect().height,
              };
            });
            return out;""")
        return PageLoad(ready=ready, open_s=open_s,
                        charts_ready_ms=driver.execute_script(
                            "return window.autoplaceChartsReadyMs || null"),
                        errors=errors, charts=charts)

    def script(self, source: str, *args: Any) -> Any:
        return self.driver.execute_script(source, *args)

    def screenshot(self, path: str | Path, *, full_page: bool = False) -> Path:
        """A PNG of the window, or of the whole page with ``full_page``."""
        if full_page:
            height = self.driver.execute_script("return document.documentElement.scrollHeight")
            self.driver.set_window_size(self.size[0], int(height))
        self.driver.save_screenshot(str(path))
        return Path(path)

    def resources_fetched(self) -> list[str]:
        """Every resource the page fetched after loading itself (none: it is self-contained)."""
        return list(self.driver.execute_script(
            "return performance.getEntriesByType('resource').map(function (e) { return e.name; })"))
