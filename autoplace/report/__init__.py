"""The report stage: a plan dictionary (the content of ``plan.json``) turned into a page and
summaries people read.

Everything here works from the plan dictionary alone, so a report can be re-rendered from a plan
file without re-tracing or re-solving (``autoplace report OUT/plan.json``). Read in this order:

* ``units``: the human units every number is shown in.
* ``schema``: the JSON Schema check (``validate_plan_dict``) and ``read_plan_file``.
* ``analysis``: what the report says, as data (summary facts, critical path, memory over time,
  module tree).
* ``charts``: the plotly figures (timeline, memory, comparison, solver progress).
* ``text``: the ``rich`` terminal summary and ``summary.txt``.
* ``page``: the Jinja2 templates in ``autoplace/templates`` filled in: ``report.html`` and
  ``summary.md``; ``write_report`` writes all three files.

The renderers trust the plan's numbers; checking the timing invariants (durations, no overlap,
transfer delays) is the simulator's job, not the report's.
"""

from __future__ import annotations

from autoplace.report.analysis import critical_path, memory_timelines, module_tree, overview
from autoplace.report.page import REPORT_FILES, render_html, render_markdown, write_report
from autoplace.report.schema import load_schema, read_plan_file, validate_plan_dict
from autoplace.report.text import print_summary, summary_renderable, summary_text
from autoplace.report.units import format_bytes, format_seconds

__all__ = [
    "REPORT_FILES",
    "critical_path",
    "format_bytes",
    "format_seconds",
    "load_schema",
    "memory_timelines",
    "module_tree",
    "overview",
    "print_summary",
    "read_plan_file",
    "render_html",
    "render_markdown",
    "summary_renderable",
    "summary_text",
    "validate_plan_dict",
    "write_report",
]
