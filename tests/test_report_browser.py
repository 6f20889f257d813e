"""Every example's report, opened in headless Chromium: no JavaScript errors, nothing fetched,
the timeline, memory and comparison charts drawn by plotly, a screenshot taken, and the module
tree's search and sort working; a training plan's schedule drawn as forward and backward blocks
on every device. Skipped where Chromium, chromedriver or selenium is missing, and
failed there under CI=true (``conftest.require``): CI installs them (.ci/run).

The plans are made once for the module with a short time limit and no emitting: the page, not
the solver, is under test here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import zoo
from conftest import require
from report_browser import HeadlessChromium, available

import autoplace
from autoplace.config import Config, Emit, Solve
from autoplace.trace.load import load_model_file

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NAMES = ("mlp", "lenet", "inception", "gpt2")



@pytest.fixture(autouse=True, scope="module")
def _browser_present() -> None:
    reason = available()
    require(reason is None, str(reason))


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name in NAMES:
        loaded = load_model_file(EXAMPLES / f"{name}.py")
        plan, emitted = autoplace.plan(
            loaded.model,
            loaded.kwargs or loaded.args,
            Config(
                devices="2xA100-40GB,1xT4",
                name=loaded.name,
                solve=Solve(time_limit_s=1),
                emit=Emit(model=False),
            ),
        )
        out[name] = autoplace.save(plan, tmp_path_factory.mktemp(name) / "out",
                                   emitted) / "report.html"
    return out


@pytest.fixture(scope="module")
def training_report(tmp_path_factory) -> Path:
    plan = zoo.mlp_training_plan("adam", device_bytes=5_500_000)  # split over both GPUs
    return autoplace.save(plan, tmp_path_factory.mktemp("training") / "out") / "report.html"


@pytest.fixture(scope="module")
def browser():
    with HeadlessChromium() as b:
        yield b


@pytest.mark.parametrize("name", NAMES)
def test_report_opens_without_errors_and_draws_every_chart(reports, browser, name, tmp_path):
    load = browser.open(reports[name])
    assert load.ready, "the charts never finished drawing"
    assert load.errors == []
    assert browser.resources_fetched() == []  # self-contained: nothing from the network
    for chart in ("timeline", "memory", "memory-peak", "comparison"):
        drawn = load.charts[chart]
        assert drawn["plotly"] and drawn["svgs"] >= 1, chart
        assert drawn["width"] > 600 and drawn["height"] > 100, chart
    # CP-SAT records its progress only when it searched (not when presolve settled it).
    assert "progress" in load.charts or browser.script(
        "return document.getElementById('progress-missing').textContent"
    ) == "solver progress not recorded"
    nodes = int(browser.script(
        "return document.querySelector('#modules tbody tr').dataset.nodes"))
    assert load.charts["timeline"]["bars"] == nodes  # a bar per node
    assert load.charts["comparison"]["bars"] >= 2  # the plan and at least one baseline
    assert load.charts["memory"]["lines"] >= 3  # a curve and a capacity line per device
    shot = browser.screenshot(tmp_path / f"report-{name}.png", full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_module_tree_filters_and_sorts(reports, browser):
    browser.open(reports["inception"])
    visible = "return [...document.querySelectorAll('#modules tbody tr')].filter(r => !r.hidden)"
    total = browser.script(visible + ".length")
    search = browser.driver.find_element("id", "module-search")
    search.send_keys("branch_pool")
    rows = browser.script(visible + ".map(r => r.dataset.path + '/' + r.dataset.label)")
    assert 1 < len(rows) < total
    assert all("branch_pool" in row or row.endswith(("inception", "/block1", "/block2"))
               for row in rows), rows
    search.clear()
    search.send_keys(" ")  # clear() fires no input event; a blank query shows the tree again
    browser.driver.find_element("css selector", "#modules th[data-sort=time]").click()
    times = browser.script(visible + ".map(r => +r.dataset.time)")
    assert times == sorted(times, reverse=True) and len(times) > total


def test_a_training_report_draws_forward_and_backward_blocks_on_every_device(
        training_report, browser) -> None:
    load = browser.open(training_report)
    assert load.ready and load.errors == []
    assert browser.resources_fetched() == []
    lanes = browser.script("""
        var out = {};
        document.getElementById('timeline').data.forEach(function (t) {
          if (t.type === 'bar') out[t.name] = t.y; });
        return out;""")
    assert set(lanes) == {"forward", "backward", "optimizer step"}
    for phase in ("forward", "backward"):
        assert set(lanes[phase]) == {0, 1}, phase  # both devices, top lane 0
    assert load.charts["timeline"]["bars"] == sum(len(y) for y in lanes.values())
    assert browser.script(
        "return document.querySelectorAll('#training-memory tbody tr').length") == 2
    stacked = browser.script(
        "return document.getElementById('memory-peak').data.map(function (t) { return t.name; })")
    assert "gradients" in stacked and "optimizer state" in stacked
