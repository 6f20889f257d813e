"""The report stage: a ``Plan`` turned into a page and summaries people read.

Everything here works from the plan alone, so a report can be re-rendered from a plan file
without re-tracing or re-solving (``autoplace report OUT/plan.json``, through
``autoplace.formats.plan.read_plan``). Read in this order: ``units`` (the human units every
number is shown in); ``analysis`` (what the report says, as data: summary facts, critical path,
memory over time, module tree; for a training plan, the step's facts, its memory by part from
``autoplace.train.breakdown`` and its schedule as blocks of one phase and micro-batch);
``charts`` (the plotly figures: timeline, memory, comparison, solver progress); ``text`` (the
``rich`` terminal summary and ``summary.txt``); ``page`` (the Jinja2 templates in
``autoplace/templates`` filled in: ``report.html`` and ``summary.md``; ``write_report`` writes
all three files, together or not at all).

The renderers trust the plan's numbers; checking the timing invariants (durations, no overlap,
transfer delays) is the simulator's job, not the report's.
"""

from __future__ import annotations

from autoplace.report.analysis import critical_path, memory_timelines, module_tree, overview
from autoplace.report.page import REPORT_FILES, render_html, render_markdown, write_report
from autoplace.report.text import print_summary, summary_renderable, summary_text
from autoplace.report.units import format_bytes, format_seconds

__all__ = [
    "REPORT_FILES",
    "critical_path",
    "format_bytes",
    "format_seconds",
    "memory_timelines",
    "module_tree",
    "overview",
    "print_summary",
    "render_html",
    "render_markdown",
    "summary_renderable",
    "summary_text",
    "write_report",
]
