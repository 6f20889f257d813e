"""The report stage: turn a plan dictionary (the content of ``plan.json``) into a page and text.

Everything here works from the plan dictionary alone, so a report can be re-rendered from a plan
file without re-tracing or re-solving. Read in this order:

* ``format_bytes`` / ``format_seconds``: the human units every number below is shown in.
* ``load_schema`` / ``validate_plan_dict``: the JSON Schema in ``schema/plan.schema.json`` plus the
  cross-references a schema cannot express (every device a node names exists, ...).
* ``summary_text``: a dozen lines for the terminal.
* ``render_html``: one self-contained page (inline CSS and SVG, no scripts, no external assets)
  with a summary, a per-device Gantt timeline (``id="timeline"``), memory against capacity
  (``id="memory"``), the baselines (``id="baselines"``) and a table of nodes.

The renderers trust the plan's numbers; checking the timing invariants (durations, no overlap,
transfer delays) is the simulator's job, not the report's.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "format_bytes",
    "format_seconds",
    "load_schema",
    "render_html",
    "summary_text",
    "validate_plan_dict",
]

# Tableau 10: distinguishable, print-safe, and still readable for the common colour blindnesses.
_PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip

# ---------------------------------------------------------------------------------------------
# Units


def format_bytes(n: float | None) -> str:
    """``1536`` -> ``"1.5 KiB"``. Binary units, because device capacities are quoted in GiB."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    if value < 1024:
        return f"{sign}{int(value)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            return f"{sign}{_sig3(value)} {unit}"
    raise AssertionError("unreachable")


def format_seconds(s: float | None) -> str:
    """``0.0123`` -> ``"12.3 ms"``: three significant digits in ns, µs, ms, s, min or h."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "n/a"
    if s == 0:
        return "0 s"
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s < 1e-6:
        return f"{sign}{_sig3(s * 1e9)} ns"
    if s < 1e-3:
        return f"{sign}{_sig3(s * 1e6)} µs"
    if s < 1:
        return f"{sign}{_sig3(s * 1e3)} ms"
    if s < 60:
        return f"{sign}{_sig3(s)} s"
    if s < 3600:
        return f"{sign}{_sig3(s / 60)} min"
    return f"{sign}{_sig3(s / 3600)} h"


def _sig3(x: float) -> str:
    # Three significant digits without scientific notation: 1.23, 12.3, 123, 1234.
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


# ---------------------------------------------------------------------------------------------
# Schema and validation


def load_schema() -> dict[str, Any]:
    """The plan.json JSON Schema (draft 2020-12) shipped as package data."""
    try:
        # One joinpath per component: a namespace package's MultiplexedPath takes only one.
        path: Any = resources.files("autoplace").joinpath("schema").joinpath("plan.schema.json")
        text = path.read_text(encoding="utf-8")
    except (OSError, TypeError):
        # Python 3.11's namespace-package reader rejects the placeholder path entry that an
        # editable install adds (NotADirectoryError); the file sits next to this module anyway.
        text = (Path(__file__).parent / "schema" / "plan.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def validate_plan_dict(plan: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the path of each problem if ``plan`` is not a valid plan.

    Checks the JSON Schema first, then the cross-references a schema cannot state: nodes, links,
    transfers and memory entries name devices that exist; edges, transfers and colocation groups
    name nodes that exist; every node has a duration on its own device.
    """
    try:
        import jsonschema
    except ImportError as exc:  # jsonschema is a dev extra, not a runtime dependency
        raise ImportError(
            "validating a plan needs the jsonschema package: pip install jsonschema "
            "(or pip install 'autoplace[dev]')"
        ) from exc

    validator = jsonschema.Draft202012Validator(load_schema())
    errors = sorted(validator.iter_errors(plan), key=lambda e: [str(p) for p in e.absolute_path])
    problems = [f"{_json_path(e.absolute_path)}: {e.message}" for e in errors]
    if not problems:
        problems = _reference_problems(plan)
    if problems:
        shown = problems[:8]
        more = (
            f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
        )
        raise ValueError(
            f"plan is invalid ({len(problems)} problem{'s' if len(problems) != 1 else ''}):\n  "
            + "\n  ".join(shown)
            + more
        )


def _json_path(path: Iterable[Any]) -> str:
    out = "plan"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _reference_problems(plan: Mapping[str, Any]) -> list[str]:
    devices = [d["name"] for d in plan["devices"]]
    known_devices = set(devices)
    nodes = {n["name"] for n in plan["nodes"]}
    listed = ", ".join(devices)
    problems: list[str] = []

    def device(where: str, name: str) -> None:
        if name not in known_devices:
            problems.append(f"{where}: {name!r} is not one of the devices ({listed})")

    def node(where: str, name: str) -> None:
        if name not in nodes:
            problems.append(f"{where}: {name!r} is not a node of the plan")

    if len(known_devices) != len(devices):
        problems.append(f"plan.devices: device names must be unique, got {devices}")
    for i, n in enumerate(plan["nodes"]):
        device(f"plan.nodes[{i}].device", n["device"])
        if n["device"] not in n["compute_s"]:
            problems.append(
                f"plan.nodes[{i}].compute_s: no duration for its device {n['device']!r}"
            )
    for i, link in enumerate(plan["links"]):
        device(f"plan.links[{i}].src", link["src"])
        device(f"plan.links[{i}].dst", link["dst"])
    for i, e in enumerate(plan["edges"]):
        node(f"plan.edges[{i}].src", e["src"])
        node(f"plan.edges[{i}].dst", e["dst"])
    for i, t in enumerate(plan["transfers"]):
        node(f"plan.transfers[{i}].src", t["src"])
        device(f"plan.transfers[{i}].src_device", t["src_device"])
        device(f"plan.transfers[{i}].dst_device", t["dst_device"])
    for i, group in enumerate(plan["colocate"]):
        for j, name in enumerate(group):
            node(f"plan.colocate[{i}][{j}]", name)
    for name in plan["memory"]:
        device(f"plan.memory.{name}", name)
    return problems


# ---------------------------------------------------------------------------------------------
# Terminal summary


def summary_text(plan: Mapping[str, Any]) -> str:
    """A short plain-text summary for the terminal, one fact per line."""
    makespan = plan["makespan_s"]
    lines = [f"autoplace plan for {plan['model']} (objective: {plan['objective']})"]
    lines.append(f"  devices       {', '.join(d['name'] for d in plan['devices'])}")
    lines.append(f"  makespan      {format_seconds(makespan)}")
    lines.append(f"  speed-up      {_speedup_text(plan)}")
    gap = _gap(plan)
    gap_text = f" (gap {gap:.1%})" if gap is not None else ""
    lines.append(f"  lower bound   {format_seconds(plan['lower_bound_s'])}{gap_text}")
    solver = plan["solver"]
    lines.append(
        f"  solver        {solver['name']}: {solver['status']} "
        f"in {format_seconds(solver['wall_s'])}"
    )
    memory = plan.get("memory", {})
    width = max(len(d["name"]) for d in plan["devices"])
    for i, dev in enumerate(plan["devices"]):
        mem = memory.get(dev["name"], {})
        peak = mem.get("peak_bytes", 0)
        cap = mem.get("capacity_bytes", dev["memory_bytes"])
        over = "  OVER CAPACITY" if peak > cap else ""
        label = "memory" if i == 0 else ""
        lines.append(
            f"  {label:<13} {dev['name']:<{width}}  peak {format_bytes(peak)} / "
            f"{format_bytes(cap)} ({peak / cap:.0%}){over}"
        )
    baselines = plan.get("baselines", {})
    width = max((len(name) for name in baselines), default=0)
    for i, (name, b) in enumerate(sorted(baselines.items(), key=_baseline_key)):
        label = "baselines" if i == 0 else ""
        lines.append(f"  {label:<13} {name:<{width}}  {_baseline_text(b, makespan)}")
    verification = plan.get("verification")
    if verification:
        diff = verification.get("max_abs_diff")
        diff_text = f", max |diff| {diff:.3g}" if diff is not None else ""
        lines.append(f"  verification  {verification['status']}{diff_text}")
    for note in plan.get("notes", ()):
        lines.append(f"  note          {note}")
    return "\n".join(lines)


def _speedup_text(plan: Mapping[str, Any]) -> str:
    best = plan["best_single_device"]
    speedup = plan["speedup_over_single"]
    if speedup is None or best["device"] is None:
        return "n/a (the model fits no single device)"
    return (
        f"{speedup:.2f}x over the best single device "
        f"({best['device']}, {format_seconds(best['makespan_s'])})"
    )


def _gap(plan: Mapping[str, Any]) -> float | None:
    gap = plan["solver"].get("gap")
    if gap is not None:
        return float(gap)
    # Derivable from the top-level numbers when the solver did not report one (e.g. a fallback).
    makespan, bound = plan["makespan_s"], plan["lower_bound_s"]
    return (makespan - bound) / makespan if makespan > 0 else None


def _baseline_key(item: tuple[str, Mapping[str, Any]]) -> tuple[float, str]:
    makespan = item[1].get("makespan_s")
    return (math.inf if makespan is None else makespan, item[0])


def _baseline_text(baseline: Mapping[str, Any], plan_makespan_s: float) -> str:
    makespan = baseline.get("makespan_s")
    if makespan is None:
        return "could not be scheduled"
    ratio = f"  {makespan / plan_makespan_s:.2f}x the plan" if plan_makespan_s > 0 else ""
    feasible = "" if baseline.get("feasible", True) else "  (infeasible: exceeds memory)"
    return f"{format_seconds(makespan)}{ratio}{feasible}"


# ---------------------------------------------------------------------------------------------
# HTML page

_CSS = """
:root { color-scheme: light; --fg: #1f2328; --muted: #656d76; --line: #d0d7de; --bg2: #f6f8fa; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--fg); background: #fff; }
main { max-width: 1200px; margin: 0 auto; padding: 24px 28px 40px; }
h1 { font-size: 24px; margin: 0 0 2px; }
h2 { font-size: 17px; margin: 32px 0 8px; padding-bottom: 4px;
  border-bottom: 1px solid var(--line); }
.sub { color: var(--muted); margin: 0 0 16px; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr)); gap: 12px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; background: #fff; }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 22px; font-weight: 600; margin: 2px 0; font-variant-numeric: tabular-nums; }
.card .d { color: var(--muted); font-size: 12.5px; }
.ok { color: #1a7f37; } .bad { color: #cf222e; } .meh { color: var(--muted); }
ul.notes { margin: 12px 0 0; padding-left: 20px; } ul.notes li { margin: 2px 0; }
.facts { margin: 12px 0 0; color: var(--muted); font-size: 13px; }
.sw { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px;
  vertical-align: baseline; }
svg { display: block; font-family: inherit; }
svg text { fill: var(--fg); }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { text-align: left; padding: 5px 10px; border-bottom: 1px solid var(--line);
  vertical-align: middle; }
th { background: var(--bg2); font-weight: 600; font-size: 12.5px; }
td.n, th.n { text-align: right; }
tr.plan td { font-weight: 600; background: #f0f6ff; }
code { font: 12.5px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
details > summary { cursor: pointer; color: var(--muted); margin: 6px 0; }
.legend { color: var(--muted); font-size: 12.5px; margin: 4px 0 0; }
footer { margin-top: 36px; color: var(--muted); font-size: 12px; }
"""


def render_html(plan: Mapping[str, Any]) -> str:
    """A self-contained HTML page for ``plan``: no scripts, no external assets, works offline.

    Hovering any bar in the charts shows a native tooltip (SVG ``<title>``), so nothing depends on
    JavaScript. All text from the plan is HTML-escaped.
    """
    colors = {d["name"]: _PALETTE[i % len(_PALETTE)] for i, d in enumerate(plan["devices"])}
    for n in plan["nodes"]:  # a node on an unlisted device still gets a lane rather than a crash
        colors.setdefault(n["device"], _PALETTE[len(colors) % len(_PALETTE)])
    t_max = max(
        [plan["makespan_s"]]
        + [n["end_s"] for n in plan["nodes"]]
        + [t["end_s"] for t in plan["transfers"]]
    )
    t_max = t_max if t_max > 0 else 1.0
    model = _e(plan["model"])
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>autoplace: {model}</title><style>{_CSS}</style></head><body><main>",
        _header_html(plan),
        '<section id="timeline-section"><h2>Timeline</h2>',
        _timeline_svg(plan, colors, t_max),
        '<p class="legend">One lane per device; each bar is a node from its start to its end. '
        "Arrows are transfers between devices, from when they start to when they arrive. "
        "Hover a bar for details.</p></section>",
        _memory_html(plan, colors, t_max),
        _baselines_html(plan),
        _nodes_html(plan, colors),
        _devices_html(plan, colors),
        f"<footer>Rendered from plan.json (schema v{_e(plan.get('schema_version', '?'))}) by "
        f"autoplace {_e(plan.get('autoplace_version', ''))}; created {_e(plan.get('created', ''))}."
        "</footer></main></body></html>",
    ]
    return "\n".join(parts)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _card(key: str, value: str, detail: str = "", cls: str = "") -> str:
    cls_attr = f' class="v {cls}"' if cls else ' class="v"'
    return (
        f'<div class="card"><div class="k">{_e(key)}</div><div{cls_attr}>{_e(value)}</div>'
        f'<div class="d">{_e(detail)}</div></div>'
    )


def _header_html(plan: Mapping[str, Any]) -> str:
    best = plan["best_single_device"]
    speedup = plan["speedup_over_single"]
    if speedup is None or best["device"] is None:
        speed = _card("Speed-up", "n/a", "the model fits no single device")
    else:
        speed = _card(
            "Speed-up",
            f"{speedup:.2f}×",
            f"over the best single device, {best['device']} ({format_seconds(best['makespan_s'])})",
        )
    gap = _gap(plan)
    solver = plan["solver"]
    limit = solver.get("time_limit_s")
    limit_text = f" of {format_seconds(limit)} limit" if limit else ""
    verification = plan.get("verification")
    cards = [
        _card("Makespan", format_seconds(plan["makespan_s"]), f"objective: {plan['objective']}"),
        speed,
        _card(
            "Lower bound",
            format_seconds(plan["lower_bound_s"]),
            f"gap {gap:.1%}" if gap is not None else "gap unknown",
        ),
        _card(
            "Solver",
            str(solver["status"]),
            f"{solver['name']}, {format_seconds(solver['wall_s'])}{limit_text}",
        ),
    ]
    if verification:
        status = verification["status"]
        diff = verification.get("max_abs_diff")
        detail = verification.get("detail", "")
        if diff is not None:
            detail = f"{detail} · max |diff| {diff:.3g}" if detail else f"max |diff| {diff:.3g}"
        cls = {"passed": "ok", "failed": "bad"}.get(status, "meh")
        cards.append(_card("Verification", status, detail, cls))
    devices = ", ".join(
        f"{_e(d['name'])} ({_e(d['type'])}, {_e(format_bytes(d['memory_bytes']))})"
        for d in plan["devices"]
    )
    facts = [f"<b>Devices:</b> {devices}", f"<b>Tracer:</b> {_e(plan['tracer'])}"]
    coarsening = plan.get("coarsening")
    if coarsening:
        steps = "; ".join(coarsening.get("steps", ()))
        facts.append(
            f"<b>Graph:</b> {coarsening['traced_ops']} traced ops coarsened to "
            f"{coarsening['plan_nodes']} plan nodes" + (f" ({_e(steps)})" if steps else "")
        )
    sources: dict[str, int] = {}
    for n in plan["nodes"]:
        sources[n["cost_source"]] = sources.get(n["cost_source"], 0) + 1
    facts.append(
        "<b>Costs:</b> " + ", ".join(f"{count} {_e(src)}" for src, count in sorted(sources.items()))
    )
    notes = plan.get("notes") or ()
    notes_html = (
        '<ul class="notes">' + "".join(f"<li>{_e(note)}</li>" for note in notes) + "</ul>"
        if notes
        else ""
    )
    return (
        f"<header><h1>{_e(plan['model'])}</h1>"
        f'<p class="sub">autoplace placement plan · {len(plan["nodes"])} nodes on '
        f"{len(plan['devices'])} devices</p>"
        f'<div class="cards">{"".join(cards)}</div>'
        f'<div class="facts">{"<br>".join(facts)}</div>{notes_html}</header>'
    )


def _time_unit(t_max_s: float) -> tuple[str, float]:
    # The axis unit follows the span so tick labels stay short (0-900 µs, 0-40 ms, 0-3 s).
    if t_max_s < 2e-3:
        return "µs", 1e6
    if t_max_s < 2:
        return "ms", 1e3
    return "s", 1.0


def _ticks(t_max_s: float, target: int = 8) -> list[float]:
    # 1-2-5 steps give round labels; aim for about `target` ticks over the span.
    raw = t_max_s / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    count = int(t_max_s / step + 1e-9)
    return [i * step for i in range(count + 1)]


def _timeline_svg(plan: Mapping[str, Any], colors: Mapping[str, str], t_max: float) -> str:
    width, left, right, top = 1140, 160, 16, 8
    lane_h, lane_gap, axis_h = 38, 12, 42
    plot_w = width - left - right
    lanes = list(colors)
    lane_y = {name: top + i * (lane_h + lane_gap) for i, name in enumerate(lanes)}
    height = top + len(lanes) * (lane_h + lane_gap) - lane_gap + axis_h
    unit, scale = _time_unit(t_max)

    def x(t: float) -> float:
        return left + t / t_max * plot_w

    busy: dict[str, float] = dict.fromkeys(lanes, 0.0)
    for n in plan["nodes"]:
        busy[n["device"]] += n["end_s"] - n["start_s"]
    types = {d["name"]: d["type"] for d in plan["devices"]}

    out = [
        f'<svg id="timeline" viewBox="0 0 {width} {height}" width="100%" role="img" '
        f'aria-label="per-device timeline">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#444"/></marker></defs>',
    ]
    for name in lanes:
        y = lane_y[name]
        out.append(
            f'<rect x="{left}" y="{y}" width="{plot_w}" height="{lane_h}" fill="#f3f4f6" rx="3"/>'
            f'<rect x="{left - 150}" y="{y + 6}" width="4" height="{lane_h - 12}" '
            f'fill="{colors[name]}" rx="2"/>'
            f'<text x="{left - 140}" y="{y + 16}" font-size="13" font-weight="600">'
            f"{_e(_clip(name, 20))}</text>"
            f'<text x="{left - 140}" y="{y + 31}" font-size="11" fill="#656d76" '
            f'style="fill:#656d76">{_e(_clip(types.get(name, ""), 12))} · '
            f"busy {busy[name] / t_max:.0%}</text>"
        )
    axis_y = height - axis_h + 6
    for t in _ticks(t_max):
        tx = x(t)
        out.append(
            f'<line x1="{tx:.1f}" y1="{top}" x2="{tx:.1f}" y2="{axis_y}" stroke="#d0d7de" '
            f'stroke-width="0.6"/><text x="{tx:.1f}" y="{axis_y + 14}" font-size="11" '
            f'text-anchor="middle">{_tick_label(t * scale)}</text>'
        )
    out.append(
        f'<text x="{left + plot_w}" y="{axis_y + 28}" font-size="11" text-anchor="end" '
        f'style="fill:#656d76">time ({unit})</text>'
    )
    for n in plan["nodes"]:
        x0, x1 = x(n["start_s"]), x(n["end_s"])
        w = max(x1 - x0, 0.8)  # a zero-length node still shows as a hairline
        y = lane_y[n["device"]] + 4
        tip = _node_tip(n)
        label = ""
        if w > 34:
            label = (
                f'<text x="{x0 + 4:.1f}" y="{y + lane_h / 2 + 0.5:.1f}" font-size="11" '
                f'fill="#fff" style="fill:#fff" pointer-events="none">'
                f"{_e(_clip(n['name'], int((w - 8) / 6.3)))}</text>"
            )
        out.append(
            f'<g class="node"><title>{_e(tip)}</title><rect x="{x0:.1f}" y="{y}" '
            f'width="{w:.1f}" height="{lane_h - 8}" fill="{colors[n["device"]]}" '
            f'stroke="#fff" stroke-width="0.8" rx="2"/>{label}</g>'
        )
    for t in plan["transfers"]:
        src, dst = t["src_device"], t["dst_device"]
        if src not in lane_y or dst not in lane_y:
            continue
        down = lane_y[src] < lane_y[dst]
        y1 = lane_y[src] + (lane_h if down else 0)
        y2 = lane_y[dst] + (0 if down else lane_h)
        x1, x2 = x(t["start_s"]), x(t["end_s"])
        coords = f'x1="{x1:.1f}" y1="{y1}" x2="{x2:.1f}" y2="{y2}"'
        tip = (
            f"transfer of {t['src']}: {src} → {dst}\n{format_bytes(t['bytes'])} in "
            f"{format_seconds(t['end_s'] - t['start_s'])} "
            f"({format_seconds(t['start_s'])} → {format_seconds(t['end_s'])})"
        )
        # The wide transparent twin gives the 1.4 px arrow a hover target a mouse can hit.
        out.append(
            f'<g class="transfer"><title>{_e(tip)}</title>'
            f'<line {coords} stroke="#444" stroke-width="1.4" marker-end="url(#arrow)"/>'
            f'<line {coords} stroke="transparent" stroke-width="8"/></g>'
        )
    out.append("</svg>")
    return "\n".join(out)


def _node_tip(n: Mapping[str, Any]) -> str:
    ops = n["ops"]
    shown = ", ".join(ops[:4]) + (f", … ({len(ops)} ops)" if len(ops) > 4 else "")
    return (
        f"{n['name']}\nmodule: {n['module'] or '(none)'}\n"
        f"ops: {len(ops)} ({shown})\n"
        f"{format_seconds(n['end_s'] - n['start_s'])} on {n['device']}, "
        f"{format_seconds(n['start_s'])} → {format_seconds(n['end_s'])}\n"
        f"params {format_bytes(n['memory_bytes'])}, output {format_bytes(n['output_bytes'])}\n"
        f"cost: {n['cost_source']}"
    )


def _tick_label(v: float) -> str:
    return f"{round(v, 9):g}"


def _clip(text: str, max_chars: int) -> str:
    text = str(text)
    if len(text) <= max_chars:
        return text
    return text[: max(max_chars - 1, 1)] + "…"


def _memory_html(plan: Mapping[str, Any], colors: Mapping[str, str], t_max: float) -> str:
    memory = plan.get("memory", {})
    rows = []
    for dev in plan["devices"]:
        name = dev["name"]
        mem = memory.get(name, {})
        peak = int(mem.get("peak_bytes", 0))
        cap = int(mem.get("capacity_bytes", dev["memory_bytes"]))
        resident = int(mem.get("resident_bytes", 0))
        color = colors[name]
        cls = ' class="bad"' if peak > cap else ""
        over = f" — over by {format_bytes(peak - cap)}" if peak > cap else ""
        rows.append(
            f'<tr><td><span class="sw" style="background:{color}"></span>{_e(name)}</td>'
            f"<td>{_memory_bar(peak, cap, resident, color)}</td>"
            f'<td class="n"><span{cls}>{_e(format_bytes(peak))} / {_e(format_bytes(cap))} '
            f"({peak / cap:.0%}){_e(over)}</span><br>"
            f'<span class="meh">params {_e(format_bytes(resident))}</span></td>'
            f"<td>{_memory_sparkline(mem.get('timeline') or [], peak, cap, color, t_max)}</td></tr>"
        )
    return (
        '<section id="memory"><h2>Memory</h2><table><thead><tr><th>Device</th>'
        '<th>Peak against capacity</th><th class="n">Peak / capacity</th>'
        "<th>Over time</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
        '<p class="legend">Dark: parameters and buffers resident for the whole run; light: peak '
        "including activations; the track is the device's capacity. The curve shares the "
        "timeline's time axis.</p></section>"
    )


def _memory_bar(peak: int, cap: int, resident: int, color: str) -> str:
    width, height = 380, 18
    full = max(peak, cap, 1)

    def w(b: float) -> float:
        return b / full * width

    over = ""
    if peak > cap:  # mark where capacity ends so the overflow reads as overflow
        over = (
            f'<line x1="{w(cap):.1f}" y1="0" x2="{w(cap):.1f}" y2="{height}" stroke="#cf222e" '
            f'stroke-width="2"/>'
        )
    tip = f"peak {format_bytes(peak)} of {format_bytes(cap)}; params {format_bytes(resident)}"
    return (
        f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">'
        f"<title>{_e(tip)}</title>"
        f'<rect width="{w(cap):.1f}" height="{height}" fill="#eaeef2" rx="3"/>'
        f'<rect width="{w(peak):.1f}" height="{height}" fill="{color}" fill-opacity="0.4" rx="3"/>'
        f'<rect width="{w(min(resident, full)):.1f}" height="{height}" '
        f'fill="{color}" rx="3"/>{over}</svg>'
    )


def _memory_sparkline(
    timeline: Sequence[Sequence[float]], peak: int, cap: int, color: str, t_max: float
) -> str:
    width, height, pad = 300, 46, 2
    if not timeline:
        return '<span class="meh">no timeline</span>'
    points = _downsample([(float(t), float(b)) for t, b in timeline], buckets=width)
    y_max = max(max(b for _, b in points), peak, 1) * 1.1

    def sx(t: float) -> float:
        return min(t / t_max, 1.0) * width

    def sy(b: float) -> float:
        return height - pad - b / y_max * (height - 2 * pad)

    # Each sample holds until the next one: draw steps, not slopes.
    coords = []
    for i, (t, b) in enumerate(points):
        t_next = points[i + 1][0] if i + 1 < len(points) else t_max
        coords.append(f"{sx(t):.1f},{sy(b):.1f} {sx(max(t_next, t)):.1f},{sy(b):.1f}")
    line = " ".join(coords)
    area = f"{sx(points[0][0]):.1f},{height} {line} {sx(t_max):.1f},{height}"
    cap_line = ""
    if cap <= y_max:
        cap_line = (
            f'<line x1="0" y1="{sy(cap):.1f}" x2="{width}" y2="{sy(cap):.1f}" stroke="#cf222e" '
            f'stroke-dasharray="4 3" stroke-width="1"/>'
        )
    tip = f"memory over time; peak {format_bytes(peak)}"
    return (
        f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">'
        f"<title>{_e(tip)}</title>"
        f'<rect width="{width}" height="{height}" fill="#f6f8fa" rx="3"/>'
        f'<polygon points="{area}" fill="{color}" fill-opacity="0.18"/>'
        f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.5"/>'
        f"{cap_line}</svg>"
    )


def _downsample(points: list[tuple[float, float]], *, buckets: int) -> list[tuple[float, float]]:
    # Keep a page for a long timeline small: one point per pixel column, keeping each column's
    # maximum so the peak survives.
    if len(points) <= 2 * buckets:
        return points
    t0, t1 = points[0][0], points[-1][0]
    span = (t1 - t0) or 1.0
    kept: dict[int, tuple[float, float]] = {}
    for t, b in points:
        k = min(int((t - t0) / span * buckets), buckets - 1)
        if k not in kept:
            kept[k] = (t, b)
        elif b > kept[k][1]:
            kept[k] = (kept[k][0], b)
    return [kept[k] for k in sorted(kept)]


def _baselines_html(plan: Mapping[str, Any]) -> str:
    makespan = plan["makespan_s"]
    memory = plan.get("memory", {})
    plan_fits = all(m.get("peak_bytes", 0) <= m.get("capacity_bytes", 1) for m in memory.values())
    rows = [
        f'<tr class="plan"><td>autoplace plan</td><td class="n">{_e(format_seconds(makespan))}'
        f'</td><td class="n">1.00×</td><td>{"yes" if plan_fits else "no"}</td>'
        f"<td>{_e(_peaks_text({k: m.get('peak_bytes', 0) for k, m in memory.items()}))}</td></tr>"
    ]
    for name, b in sorted(plan.get("baselines", {}).items(), key=_baseline_key):
        b_makespan = b.get("makespan_s")
        ratio = (
            f"{b_makespan / makespan:.2f}×" if b_makespan is not None and makespan > 0 else "n/a"
        )
        feasible = '<span class="ok">yes</span>' if b["feasible"] else '<span class="bad">no</span>'
        rows.append(
            f'<tr><td>{_e(name)}</td><td class="n">{_e(format_seconds(b_makespan))}</td>'
            f'<td class="n">{_e(ratio)}</td><td>{feasible}</td>'
            f"<td>{_e(_peaks_text(b.get('peak_bytes', {})))}</td></tr>"
        )
    return (
        '<section><h2>Baselines</h2><table id="baselines"><thead><tr><th>Placement</th>'
        '<th class="n">Makespan</th><th class="n">Makespan ÷ plan</th><th>Fits memory</th>'
        "<th>Peak memory per device</th></tr></thead><tbody>"
        + "".join(rows)
        + '</tbody></table><p class="legend">Every row is scored by the same simulator; '
        "above 1.00× the baseline is slower than the plan.</p></section>"
    )


def _peaks_text(peaks: Mapping[str, int]) -> str:
    return ", ".join(f"{dev} {format_bytes(b)}" for dev, b in peaks.items())


def _nodes_html(plan: Mapping[str, Any], colors: Mapping[str, str]) -> str:
    nodes = sorted(plan["nodes"], key=lambda n: (n["start_s"], n["device"], n["name"]))
    rows = []
    for n in nodes:
        rows.append(
            f"<tr><td><code>{_e(n['name'])}</code></td><td><code>{_e(n['module'])}</code></td>"
            f'<td><span class="sw" style="background:{colors[n["device"]]}"></span>'
            f"{_e(n['device'])}</td>"
            f'<td class="n">{_e(format_seconds(n["start_s"]))}</td>'
            f'<td class="n">{_e(format_seconds(n["end_s"] - n["start_s"]))}</td>'
            f'<td class="n">{_e(format_bytes(n["memory_bytes"]))}</td>'
            f'<td class="n">{_e(format_bytes(n["output_bytes"]))}</td>'
            f'<td class="n">{len(n["ops"])}</td><td>{_e(n["cost_source"])}</td></tr>'
        )
    # Small plans show the table straight away; big ones fold it so the charts stay on screen.
    open_attr = " open" if len(nodes) <= 60 else ""
    return (
        f'<section id="nodes"><h2>Nodes</h2><details{open_attr}><summary>{len(nodes)} nodes, '
        "in start order</summary><table><thead><tr><th>Node</th><th>Module</th><th>Device</th>"
        '<th class="n">Start</th><th class="n">Duration</th><th class="n">Params</th>'
        '<th class="n">Output</th><th class="n">Ops</th><th>Cost</th></tr></thead><tbody>'
        + "".join(rows)
        + "</tbody></table></details></section>"
    )


def _devices_html(plan: Mapping[str, Any], colors: Mapping[str, str]) -> str:
    rows = [
        f'<tr><td><span class="sw" style="background:{colors[d["name"]]}"></span>{_e(d["name"])}'
        f"</td><td>{_e(d['type'])}</td><td>{_e(d['host'])}</td>"
        f"<td><code>{_e(d['torch_device'])}</code></td>"
        f'<td class="n">{_e(format_bytes(d["memory_bytes"]))}</td></tr>'
        for d in plan["devices"]
    ]
    links = [
        f"<tr><td>{_e(link['src'])} → {_e(link['dst'])}</td><td>{_e(link['kind'])}</td>"
        f'<td class="n">{_e(format_bytes(link["bandwidth_bytes_per_s"]))}/s</td>'
        f'<td class="n">{_e(format_seconds(link["latency_s"]))}</td></tr>'
        for link in plan["links"]
    ]
    links_html = (
        f"<details><summary>{len(links)} links</summary><table><thead><tr><th>Link</th>"
        '<th>Kind</th><th class="n">Bandwidth</th><th class="n">Latency</th></tr></thead>'
        "<tbody>" + "".join(links) + "</tbody></table></details>"
        if links
        else ""
    )
    return (
        '<section id="devices"><h2>Devices</h2><table><thead><tr><th>Device</th><th>Type</th>'
        '<th>Host</th><th>torch device</th><th class="n">Memory</th></tr></thead><tbody>'
        + "".join(rows)
        + f"</tbody></table>{links_html}</section>"
    )
