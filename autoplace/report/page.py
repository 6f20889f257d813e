"""Rendering: the Jinja2 templates in ``autoplace/templates`` filled from ``analysis`` and
``charts``, and writing the report files next to a plan.

``render_html`` makes one self-contained page: CSS, a few lines of JavaScript and plotly.js
itself (its basic bundle, once per page) are inlined, so it opens offline and fetches nothing.
Each chart travels as JSON in a ``<script type="application/json">`` block that the page's
script hands to ``Plotly.newPlot``. ``render_markdown`` makes ``summary.md``; ``write_report``
writes ``report.html``, ``summary.md`` and ``summary.txt`` together, all or none.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from autoplace.formats.output import replace_files
from autoplace.formats.plan import SCHEMA_VERSION, Plan
from autoplace.report import analysis, charts, text
from autoplace.report.units import format_bytes, format_ratio, format_seconds, format_share

__all__ = ["REPORT_FILES", "render_html", "render_markdown", "write_report"]

REPORT_FILES = ("report.html", "summary.md", "summary.txt")
_TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


@functools.cache
def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=jinja2.select_autoescape(
            enabled_extensions=("html", "html.j2"), default_for_string=False),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True)
    env.filters.update(
        seconds=format_seconds, bytes=format_bytes, ratio=format_ratio, share=format_share,
        pct=lambda x, digits=1: "n/a" if x is None else f"{x:.{digits}%}",
        md=lambda s: str(s).replace("|", "\\|").replace("\n", " "))
    return env


@functools.cache
def plotly_js() -> str:
    """plotly.js's basic bundle (bars and lines), vendored: a quarter of the full bundle's size
    and about half its time to open (``templates/vendor/README.md``)."""
    return (_TEMPLATES / "vendor" / "plotly-basic.min.js").read_text(encoding="utf-8")


def _script_json(figure: Any) -> str:
    # JSON placed inside <script>: escaping <, > and & means no "</script>" or "<!--" in the
    # data can end the block early, whatever a module or model name contains.
    raw = figure.to_json()
    return (raw.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _phrases(ov: analysis.Overview) -> dict[str, Any]:
    return {"speedup": text.speedup_text(ov), "gap": text.gap_text(ov),
            "solver": text.solver_text(ov), "critical": text.critical_text(ov),
            "verification": text.verification_text(ov), "training": text.training_text(ov),
            "pins": text.pins_text(ov), "tensor": text.tensor_text(ov),
            "generation": text.generation_text(ov),
            "no_speedup": analysis.no_speedup_reason(ov.pins)}


def render_html(plan: Plan, ov: analysis.Overview | None = None) -> str:
    """The report page for ``plan``; ``ov`` is its ``analysis.overview`` when the caller has it."""
    ov = ov or analysis.overview(plan)
    figures = {
        "timeline": charts.timeline_figure(plan, ov.critical_path),
        "memory": charts.memory_figure(plan, analysis.memory_timelines(plan), ov),
        "memory-peak": charts.peak_figure(ov),
        "comparison": charts.comparison_figure(ov),
        "progress": charts.progress_figure(plan),
    }
    return _environment().get_template("report.html.j2").render(
        plan=plan, ov=ov, say=_phrases(ov), colors=charts.device_colors(plan),
        critical_color=charts.CRITICAL, phase_colors=charts.PHASE_COLORS,
        modules=analysis.module_tree(plan, ov.critical_path),
        figures={k: _script_json(f) for k, f in figures.items() if f is not None},
        plotly_js=plotly_js(), schema_version=SCHEMA_VERSION)


def render_markdown(plan: Plan, ov: analysis.Overview | None = None) -> str:
    """``summary.md``: the summary as markdown tables, for pull requests and chat."""
    ov = ov or analysis.overview(plan)
    return _environment().get_template("summary.md.j2").render(plan=plan, ov=ov, say=_phrases(ov))


def write_report(directory: str | os.PathLike[str], plan: Plan) -> list[Path]:
    """Write ``report.html``, ``summary.md`` and ``summary.txt`` for ``plan`` into
    ``directory``.

    Everything is rendered before anything is written, and the three files replace the old ones
    together (``formats.output.replace_files``): a failure leaves the old files as they were.
    """
    ov = analysis.overview(plan)
    contents = {"report.html": render_html(plan, ov), "summary.md": render_markdown(plan, ov),
                "summary.txt": text.summary_text(ov) + "\n"}
    return replace_files(directory, {name: contents[name] for name in REPORT_FILES})
