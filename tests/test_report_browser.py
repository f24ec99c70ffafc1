"""Open the rendered report in a real headless Chromium and check what a reader would see.

Needs Debian's chromium (``apt-get install -y chromium``) and the ``playwright`` package (its
driver ships in the wheel); the browser is never downloaded. Skipped with the reason when either
is missing. Set MOEPERF_SCREENSHOT_DIR to keep the screenshots for a human look.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.report.render import write_report

DATA = Path(__file__).parent / "data"
CHROMIUM = os.environ.get("MOEPERF_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / name).read_text())
    return data


def browser_missing(chromium: str) -> str | None:
    """Why the browser tests cannot run here, with the command that fixes it; None if they can."""
    if not Path(chromium).is_file():
        return f"no Chromium at {chromium}: apt-get install -y chromium (or set MOEPERF_CHROMIUM)"
    if importlib.util.find_spec("playwright") is None:
        return "playwright not installed: pip install playwright (no browser download needed)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    reason = browser_missing(CHROMIUM)
    if reason is not None:
        pytest.skip(reason)
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("browser-report")
    cpu, _ = write_report([_load("results_sample.json")], out / "cpu", title="CPU nightly")
    ab, _ = write_report([_load("results_ab_h200.json")], out / "ab", title="H200 A/B")
    return {"cpu": cpu, "ab": ab}


class Visit:
    """One page load with every console message and every request the page made."""

    def __init__(self, browser: Any, path: Path, shot: Path) -> None:
        self.console: list[str] = []
        self.errors: list[str] = []
        self.requests: list[str] = []
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("request", lambda r: self.requests.append(r.url))
        page.goto(path.as_uri(), wait_until="load")
        page.wait_for_function("Array.from(document.images).every(i => i.complete)")
        self.page = page
        self.screenshot = shot
        page.screenshot(path=str(shot), full_page=True)


def _shot_dir(tmp_path: Path) -> Path:
    d = os.environ.get("MOEPERF_SCREENSHOT_DIR")
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        return Path(d)
    return tmp_path


@pytest.mark.parametrize("name", ["cpu", "ab"])
def test_report_loads_without_errors_or_network(
    browser: Any, reports: dict[str, Path], tmp_path: Path, name: str
) -> None:
    v = Visit(browser, reports[name], _shot_dir(tmp_path) / f"report-{name}.png")
    try:
        bad = [m for m in v.console if m.startswith(("error", "warning"))]
        assert bad == [] and v.errors == []
        foreign = [u for u in v.requests if not u.startswith(("file://", "data:"))]
        assert foreign == [], f"the report fetched {foreign}"
        assert v.screenshot.stat().st_size > 20_000  # a blank page is a few kB
    finally:
        v.page.close()


@pytest.mark.parametrize(("name", "n_charts"), [("cpu", 3), ("ab", 6)])
def test_charts_render_with_nonzero_size(
    browser: Any, reports: dict[str, Path], tmp_path: Path, name: str, n_charts: int
) -> None:
    v = Visit(browser, reports[name], tmp_path / "shot.png")
    try:
        sizes = v.page.eval_on_selector_all(
            "figure img",
            "els => els.map(e => [e.naturalWidth, e.naturalHeight, "
            "e.getBoundingClientRect().width, e.getBoundingClientRect().height])",
        )
        assert len(sizes) == n_charts
        for nw, nh, w, h in sizes:
            assert nw > 100 and nh > 100, "an SVG that failed to decode has natural size 0"
            assert w > 100 and h > 100
    finally:
        v.page.close()


def test_conclusion_is_first_and_not_measured_is_visible(
    browser: Any, reports: dict[str, Path], tmp_path: Path
) -> None:
    v = Visit(browser, reports["cpu"], tmp_path / "shot.png")
    try:
        first = v.page.eval_on_selector("h1 + p", "e => e.id")
        assert first == "conclusion"
        missing = v.page.locator("div.missing")
        assert missing.count() == 6  # tok/J, MBU, board power x 2 tests: a reason each
        assert missing.first.is_visible()
        assert "not measured (no NVML on this host)" in missing.first.inner_text()
        headings = v.page.eval_on_selector_all("h2", "els => els.map(e => e.textContent)")
        assert headings[-3:] == ["Setup", "Not covered", "Reproduce"]
    finally:
        v.page.close()


def test_script_in_data_is_shown_not_run(browser: Any, tmp_path: Path) -> None:
    payload = _load("results_sample.json")
    payload["results"][0]["config_label"] = "<img src=x onerror=\"console.error('xss')\">"
    html, _ = write_report([payload], tmp_path / "evil", title="<script>alert(1)</script>")
    v = Visit(browser, html, tmp_path / "shot.png")
    try:
        assert v.console == [] and v.errors == []
        assert v.page.title() == "<script>alert(1)</script>"
        assert "<img src=x" in v.page.locator("#numbers-table").inner_text()
        assert not any(u.endswith("/x") for u in v.requests)
    finally:
        v.page.close()


def test_skip_reason_names_the_install_command(tmp_path: Path) -> None:
    """The skip message is what a developer without Chromium reads: it must say what to do."""
    reason = browser_missing(str(tmp_path / "no-such-chromium"))
    assert reason is not None and "apt-get install -y chromium" in reason
    fake = tmp_path / "chromium"
    fake.write_text("")
    reason = browser_missing(str(fake))
    if importlib.util.find_spec("playwright") is None:
        assert reason is not None and "pip install playwright" in reason
    else:
        assert reason is None
