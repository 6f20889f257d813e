"""How large the GPT-2 example's report is and how long it takes to open in headless Chromium.

    python benchmarks/report_load.py                # writes benchmarks/results/report.md
    python benchmarks/report_load.py --screenshots  # and docs/report-gpt2.png, report-inception.png

Plans examples/gpt2.py on 2xA100-40GB with `autoplace plan` and its defaults (a fresh process,
as a user runs it), then opens the report.html it wrote several times, each time in a new
headless Chromium with an empty profile: a cold open, as for someone opening the file for the
first time. An open is timed from the request until every chart is drawn
(``body[data-charts=ready]``), on the wall clock and on the page's own clock (from navigation
start). The targets (issue 5): under 10 MB, under 3 s. The machine is shared, so the load
average is recorded next to the times.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from report_browser import HeadlessChromium, available  # noqa: E402

DEVICES = "2xA100-40GB"
OPENS = 5
SIZE_LIMIT_BYTES = 10 * 10**6
OPEN_LIMIT_S = 3.0


def plan(example: str, out: Path) -> Path:
    proc = subprocess.run(
        [sys.executable, "-m", "autoplace.cli", "plan", str(ROOT / "examples" / f"{example}.py"),
         "--devices", DEVICES, "--out", str(out)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"planning {example} failed:\n{proc.stderr}")
    return out / "report.html"


def cold_opens(report: Path, count: int) -> list[tuple[float, float]]:
    times = []
    for _ in range(count):
        with HeadlessChromium() as browser:
            load = browser.open(report)
            if not load.ready or load.errors:
                raise SystemExit(f"{report} did not open cleanly: {load.errors}")
            times.append((load.open_s, load.charts_ready_ms / 1000))
    return times


def screenshot(report: Path, path: Path) -> None:
    # The top of the page: the summary cards, the timeline and the start of the memory section.
    with HeadlessChromium(width=1280, height=1300) as browser:
        browser.open(report)
        browser.script("document.querySelectorAll('.modebar').forEach(m => m.remove())")
        browser.screenshot(path)


def _chromium_version() -> str:
    proc = subprocess.run(["chromium", "--version"], capture_output=True, text=True, check=False)
    return proc.stdout.strip() or "unknown"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--screenshots", action="store_true",
                        help="also rewrite docs/report-gpt2.png and docs/report-inception.png")
    parser.add_argument("--opens", type=int, default=OPENS, help=f"cold opens (default {OPENS})")
    args = parser.parse_args()
    reason = available()
    if reason:
        raise SystemExit(f"cannot open the report here: {reason}")
    with tempfile.TemporaryDirectory() as tmp:
        report = plan("gpt2", Path(tmp) / "gpt2")
        size = report.stat().st_size
        load_before = os.getloadavg()[0]
        times = cold_opens(report, args.opens)
        load_after = os.getloadavg()[0]
        if args.screenshots:
            screenshot(report, ROOT / "docs" / "report-gpt2.png")
            screenshot(plan("inception", Path(tmp) / "inception"),
                       ROOT / "docs" / "report-inception.png")
    walls = [w for w, _ in times]
    pages = [p for _, p in times]
    verdict_size = "under" if size < SIZE_LIMIT_BYTES else "OVER"
    verdict_time = "under" if max(walls) < OPEN_LIMIT_S else "OVER"
    lines = [
        f"Measured {datetime.date.today()} on {platform.machine()}, {_cpu()}, "
        f"{os.cpu_count()} cores, {_chromium_version()} (headless, --disable-gpu), "
        f"CPython {platform.python_version()}; load average {load_before:.1f} before and "
        f"{load_after:.1f} after the opens (the machine is shared).",
        "",
        f"GPT-2-style example on {DEVICES}, report from `autoplace plan` with its defaults; "
        f"{len(times)} cold opens, each in a new Chromium with an empty profile, timed until "
        "every chart is drawn.",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| report.html size | {size / 1e6:.2f} MB ({size:,} bytes) | < 10 MB: {verdict_size} |",
        f"| open, wall clock: median / max | {statistics.median(walls):.2f} s / "
        f"{max(walls):.2f} s | < 3 s: {verdict_time} |",
        f"| open, page clock (navigation start to charts drawn): median / max | "
        f"{statistics.median(pages):.2f} s / {max(pages):.2f} s | |",
        "",
        "Every open: " + ", ".join(f"{w:.2f} s" for w in walls) + ".",
        "",
        "Reproduce with `python benchmarks/report_load.py` (`--screenshots` also rewrites the "
        "screenshots in `docs/`).",
    ]
    out = ROOT / "benchmarks" / "results" / "report.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
