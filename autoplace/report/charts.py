"""The report's charts as plotly figures, built from a ``Plan`` and ``analysis``.

One function per chart, each returning a ``plotly.graph_objects.Figure`` that the page embeds as
JSON and plotly.js draws: ``timeline_figure`` (Gantt per device, transfers, critical path; a
training plan's drawn as blocks of one phase and micro-batch), ``memory_figure`` (bytes over
time against capacity), ``peak_figure`` (peak as a share of capacity, split into its parts, a
colour each), ``comparison_figure`` (plan and baselines side by side) and ``progress_figure``
(CP-SAT's objective and bound over time, in its own model, against the plan's simulated value,
and which model that is). Text from the plan is HTML-escaped before it reaches plotly, whose
labels accept a little HTML.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from autoplace.config.choices import Objective
from autoplace.formats.plan import Plan
from autoplace.report.analysis import Block, Overview, PathStep, schedule_blocks
from autoplace.report.units import (
    bytes_unit,
    format_bytes,
    format_seconds,
    format_share,
    time_unit,
)

__all__ = [
    "PALETTE",
    "PART_COLORS",
    "PHASE_COLORS",
    "comparison_figure",
    "device_colors",
    "memory_figure",
    "peak_figure",
    "progress_figure",
    "timeline_figure",
]

# Tableau 10: distinguishable, print-safe, and still readable for the common colour blindnesses.
PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip
CRITICAL = "#c0392b"
# A training step's phases (Tableau 20's pairs): even micro-batches dark, odd ones light, so two
# micro-batches back to back read as two blocks.
PHASE_COLORS = {"forward": ("#4e79a7", "#a0cbe8"), "backward": ("#f28e2b", "#ffbe7d"),
                "step": ("#59a14f", "#8cd17d")}
# The parts a device's peak is stacked from (``peak_figure``): one Tableau 10 hue each, at
# least 40 degrees of hue apart (the training step's two extra parts hatched too); what is
# left, light grey.
PART_COLORS = {"runtime reserve": "#edc948", "parameters": "#4e79a7", "gradients": "#e15759",
               "optimizer state": "#b07aa1", "activations at peak": "#59a14f",
               "free": "#eaeef2"}
_PHASE_NAMES = {"forward": "forward", "backward": "backward", "step": "optimizer step"}
# Idle time inside a block that the drawing hides: under 3 px of a ~1000 px axis.
_MERGE_GAP = 0.003
_PLAN_COLOR = "#4e79a7"
_BASELINE_COLOR = "#9aa5b1"
_FONT = dict(family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size=12,
             color="#1f2328")

def _go() -> Any:
    # Imported on first use: `autoplace plan --help` and the solver need none of plotly.
    import plotly.graph_objects as go

    return go


def _e(value: object) -> str:
    return html.escape(str(value), quote=False)


def device_colors(plan: Plan) -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(plan.problem.cluster.names)}


def _layout(**kw: Any) -> dict[str, Any]:
    base = dict(template="plotly_white", font=_FONT, hoverlabel=dict(align="left"),
                margin=dict(l=110, r=24, t=64, b=48),
                legend=dict(orientation="h", x=0, y=1.02, yanchor="bottom",
                            traceorder="normal"))
    base.update(kw)
    return base


def _t_max(plan: Plan) -> float:
    s = plan.schedule
    t_max = max([s.makespan_s, *s.end_s.values(), *(t.end_s for t in s.transfers)])
    return t_max if t_max > 0 else 1.0


def _ops_text(ops: Sequence[str]) -> str:
    shown = ", ".join(ops[:4]) + (", …" if len(ops) > 4 else "")
    return f"{len(ops)} ({shown})"


# ---------------------------------------------------------------------------------------------
# Timeline


def timeline_figure(plan: Plan, path: Sequence[PathStep]) -> Any:
    """One lane per device; a bar per node from start to end, hover for its details (for a
    training plan, a block per run of one phase and micro-batch, coloured by phase); an arrow
    per transfer from the sending lane to the receiving one; the critical path outlined and
    traced in red."""
    go = _go()
    t_max = _t_max(plan)
    unit, scale = time_unit(t_max)
    lanes = list(plan.problem.cluster.names)
    lane = {name: i for i, name in enumerate(lanes)}
    critical_nodes = {s.name for s in path if s.kind == "node"}
    critical_transfers = {s.index for s in path if s.kind == "transfer"}
    fig = go.Figure()
    if plan.training is None:
        _add_nodes(fig, plan, lane, scale, critical_nodes)
    else:
        _add_blocks(fig, plan, schedule_blocks(plan, merge_gap_s=_MERGE_GAP * t_max), lane,
                    scale, critical_nodes)
    for critical in (False, True):
        _add_transfers(fig, plan, lane, scale, critical_transfers, critical=critical)
    _add_path(fig, path, lane, scale)
    shapes, annotations = _marker_lines(plan, scale)
    types = {d.name: d.type for d in plan.problem.cluster.devices}
    fig.update_layout(**_layout(
        height=140 + 64 * len(lanes), barmode="overlay", bargap=0.2, hovermode="closest",
        shapes=shapes, annotations=annotations,
        xaxis=dict(title=dict(text=f"time ({unit})"), range=[0, t_max * scale * 1.02],
                   zeroline=False),
        yaxis=dict(tickvals=list(range(len(lanes))), autorange=False, showgrid=False,
                   range=[len(lanes) - 0.45, -0.75], zeroline=False,
                   ticktext=[f"<b>{_e(d)}</b><br>{_e(types[d])}" for d in lanes])))
    return fig


def _add_nodes(fig: Any, plan: Plan, lane: Mapping[str, int], scale: float,
               critical_nodes: set[str]) -> None:
    # A bar per node, in its device's colour.
    go = _go()
    t_max = _t_max(plan)
    colors = device_colors(plan)
    s = plan.schedule
    device_of, start, end = s.placement.device_of, s.start_s, s.end_s
    costs = plan.problem.costs
    for dev in lane:
        nodes = [n for n in plan.problem.graph.nodes if device_of[n.name] == dev]
        crit = [n.name in critical_nodes for n in nodes]
        fig.add_trace(go.Bar(
            name=_e(dev), orientation="h", y=[lane[dev]] * len(nodes), width=0.62,
            base=[start[n.name] * scale for n in nodes],
            x=[(end[n.name] - start[n.name]) * scale for n in nodes],
            # Off the critical path a bar is faded; on it, solid and edged in red.
            marker=dict(color=colors[dev], opacity=[1.0 if c else 0.5 for c in crit],
                        line=dict(color=[CRITICAL if c else "#ffffff" for c in crit],
                                  width=[1.5 if c else 0.6 for c in crit])),
            text=[_e(n.name) if _fits(n.name, end[n.name] - start[n.name], t_max) else ""
                  for n in nodes],
            textposition="inside", insidetextanchor="start", constraintext="none",
            textfont=dict(color="#ffffff", size=11),
            customdata=[[
                _e(n.name), _e(n.module or "(none)"), _e(_ops_text(n.ops)),
                format_seconds(end[n.name] - start[n.name]), format_seconds(start[n.name]),
                format_seconds(end[n.name]), format_bytes(n.param_bytes),
                format_bytes(n.output_bytes), _e(costs.source_of(n.name, dev)),
                "<br><b>on the critical path</b>" if c else "",
            ] for n, c in zip(nodes, crit)],
            hovertemplate=(
                "<b>%{customdata[0]}</b><br>module: %{customdata[1]}<br>ops: %{customdata[2]}"
                "<br>time: %{customdata[3]} (%{customdata[4]} → %{customdata[5]})"
                "<br>params: %{customdata[6]} · output: %{customdata[7]}"
                "<br>cost: %{customdata[8]}%{customdata[9]}<extra>" + _e(dev) + "</extra>"),
        ))


def _add_blocks(fig: Any, plan: Plan, blocks: Sequence[Block], lane: Mapping[str, int],
                scale: float, critical_nodes: set[str]) -> None:
    # A trace per phase (the legend names the colours), a bar per block, labelled with its
    # micro-batch where the step has several.
    go = _go()
    t_max = _t_max(plan)
    for phase, (dark, light) in PHASE_COLORS.items():
        mine = [b for b in blocks if b.phase == phase]
        if not mine:
            continue
        crit = [any(n in critical_nodes for n in b.nodes) for b in mine]
        shade = [light if (b.microbatch or 0) % 2 else dark for b in mine]
        labels = [_block_label(b) for b in mine]
        fig.add_trace(go.Bar(
            name=_PHASE_NAMES[phase], orientation="h", y=[lane[b.device] for b in mine],
            width=0.62, base=[b.start_s * scale for b in mine],
            x=[(b.end_s - b.start_s) * scale for b in mine],
            marker=dict(color=shade, opacity=[1.0 if c else 0.6 for c in crit],
                        line=dict(color=[CRITICAL if c else "#ffffff" for c in crit],
                                  width=[1.5 if c else 0.6 for c in crit])),
            text=[label if _fits(label, b.end_s - b.start_s, t_max) else ""
                  for label, b in zip(labels, mine)],
            textposition="inside", insidetextanchor="start", constraintext="none",
            textfont=dict(color=["#1f2328" if c == light else "#ffffff" for c in shade],
                          size=11),
            customdata=[[
                _PHASE_NAMES[phase] + ("" if b.microbatch is None
                                       else f", micro-batch {b.microbatch}"),
                _e(_ops_text(b.nodes)), format_seconds(b.start_s), format_seconds(b.end_s),
                format_seconds(b.busy_s), "<br><b>on the critical path</b>" if c else "",
                _e(b.device),
            ] for b, c in zip(mine, crit)],
            hovertemplate=(
                "<b>%{customdata[0]}</b><br>nodes: %{customdata[1]}"
                "<br>%{customdata[2]} → %{customdata[3]}, busy %{customdata[4]}"
                "%{customdata[5]}<extra>%{customdata[6]}</extra>"),
        ))


def _block_label(block: Block) -> str:
    """``F3`` and ``B3`` for micro-batch 3 of several; else the phase (``step``)."""
    if block.microbatch is None:
        return _PHASE_NAMES[block.phase].split()[-1]
    return f"{block.phase[0].upper()}{block.microbatch}"


def _fits(label: str, duration_s: float, t_max: float) -> bool:
    # Label a bar only where its name fits (about 6.5 px a character on a ~1000 px axis):
    # plotly measures every label it is given, and fitting hundreds of them is most of the
    # time a page takes to draw.
    width_px = duration_s / t_max * 1000
    return width_px >= 6.5 * len(label) + 10


def _add_transfers(fig: Any, plan: Plan, lane: Mapping[str, int], scale: float,
                   critical_transfers: set[int], *, critical: bool) -> None:
    go = _go()
    xs: list[float | None] = []
    ys: list[float | None] = []
    custom: list[list[str]] = []
    symbols: list[str] = []
    sizes: list[int] = []
    for i, t in enumerate(plan.schedule.transfers):
        if (i in critical_transfers) != critical:
            continue
        src, dst = lane[t.src_device], lane[t.dst_device]
        down = dst > src  # lanes are drawn top to bottom in device order
        xs += [t.start_s * scale, t.end_s * scale, None]
        ys += [src + (0.33 if down else -0.33), dst + (-0.33 if down else 0.33), None]
        info = [_e(t.src), _e(t.src_device), _e(t.dst_device),
                format_bytes(t.bytes), format_seconds(t.end_s - t.start_s),
                format_seconds(t.start_s), format_seconds(t.end_s)]
        custom += [info, info, info]
        symbols += ["circle", "arrow", "circle"]
        sizes += [5, 12, 0]
    if not xs:
        return
    color = CRITICAL if critical else "#3d4752"
    fig.add_trace(go.Scatter(
        name="critical transfer" if critical else "transfer", x=xs, y=ys, mode="lines+markers",
        line=dict(color=color, width=2.2 if critical else 1.3), connectgaps=False,
        marker=dict(symbol=symbols, size=sizes, color=color, angleref="previous"),
        customdata=custom,
        hovertemplate=("<b>transfer of %{customdata[0]}</b><br>%{customdata[1]} → "
                       "%{customdata[2]}<br>%{customdata[3]} in %{customdata[4]}"
                       "<br>%{customdata[5]} → %{customdata[6]}<extra></extra>")))


def _add_path(fig: Any, path: Sequence[PathStep], lane: Mapping[str, int], scale: float) -> None:
    # A line just above the bars threading the critical path, so it reads left to right.
    go = _go()
    xs: list[float] = []
    ys: list[float] = []
    for step in path:
        if step.kind == "node":
            y = lane[step.device] - 0.4
            xs += [step.start_s * scale, step.end_s * scale]
            ys += [y, y]
    if not xs:
        return
    fig.add_trace(go.Scatter(
        name="critical path", x=xs, y=ys, mode="lines", hoverinfo="skip",
        line=dict(color=CRITICAL, width=3, shape="hv"), opacity=0.8))


def _marker_lines(plan: Plan, scale: float) -> tuple[list, list]:
    # Dashed: the makespan; dotted: the lower bound. Their distance is the gap, drawn.
    shapes, annotations = [], []
    lines = [(plan.makespan_s, "makespan", "dash"), (plan.lower_bound_s, "lower bound", "dot")]
    for x, label, dash in lines[:1] if plan.gap is None else lines:  # a mesh's: no bound
        shapes.append(dict(type="line", xref="x", yref="paper", x0=x * scale, x1=x * scale,
                           y0=0, y1=1, line=dict(color="#57606a", width=1, dash=dash)))
        # Both labels end at their line; the bound's sits at the foot so the two never collide.
        annotations.append(dict(
            xref="x", yref="paper", x=x * scale, y=1 if label == "makespan" else 0,
            yanchor="bottom", xanchor="right", showarrow=False, xshift=-2,
            text=f"{label} {format_seconds(x)}", font=dict(size=10, color="#57606a")))
    return shapes, annotations


# ---------------------------------------------------------------------------------------------
# Memory


def memory_figure(plan: Plan, timelines: Mapping[str, Sequence[tuple[float, int]]],
                  ov: Overview) -> Any:
    """Bytes in use per device over time (steps), each device's capacity dashed, and two
    buttons: zoom to the usage, or show the capacity (usually far above it)."""
    go = _go()
    t_max = _t_max(plan)
    unit, scale = time_unit(t_max)
    colors = device_colors(plan)
    peak = max([m["peak_bytes"] for m in ov.memory] + [1])
    cap = max(m["capacity_bytes"] for m in ov.memory)
    b_unit, b_scale = bytes_unit(max(peak, cap) if peak > 0.3 * cap else peak)
    fig = go.Figure()
    for m in ov.memory:
        dev = m["device"]
        points = list(timelines.get(dev, ())) or [(0.0, m["resident_bytes"])]
        points.append((t_max, points[-1][1]))
        fig.add_trace(go.Scatter(
            name=_e(dev), legendgroup=_e(dev), x=[t * scale for t, _ in points],
            y=[b / b_scale for _, b in points], mode="lines", line=dict(shape="hv", width=2,
                                                                       color=colors[dev]),
            fill="tozeroy", fillcolor=_alpha(colors[dev], 0.12),
            customdata=[format_bytes(b) for _, b in points],
            hovertemplate="%{customdata} at %{x:.4g} " + unit + "<extra>" + _e(dev) + "</extra>"))
        fig.add_trace(go.Scatter(
            name=f"{_e(dev)} capacity", legendgroup=_e(dev), showlegend=False,
            x=[0, t_max * scale], y=[m["capacity_bytes"] / b_scale] * 2, mode="lines",
            line=dict(color=colors[dev], dash="dash", width=1.5),
            hovertemplate=f"capacity {format_bytes(m['capacity_bytes'])}<extra>{_e(dev)}</extra>"))
    usage = [0, peak / b_scale * 1.15]
    full = [0, max(peak, cap) / b_scale * 1.05]
    start_full = peak > 0.3 * cap
    fig.update_layout(**_layout(
        height=320, hovermode="closest",
        xaxis=dict(title=dict(text=f"time ({unit})"), range=[0, t_max * scale * 1.02]),
        yaxis=dict(title=dict(text=b_unit), range=full if start_full else usage,
                   rangemode="tozero"),
        updatemenus=[dict(type="buttons", direction="right", x=1, xanchor="right", y=1.02,
                          yanchor="bottom", showactive=True, active=1 if start_full else 0,
                          pad=dict(r=0, t=0), font=dict(size=11), buttons=[
            dict(label="zoom to usage", method="relayout", args=[{"yaxis.range": usage}]),
            dict(label="show capacity", method="relayout", args=[{"yaxis.range": full}]),
        ])]))
    return fig


def peak_figure(ov: Overview) -> Any:
    """Each device's peak as a share of its capacity, stacked by part, a colour per part
    (``PART_COLORS``): runtime reserve, parameters (and, in a training step, gradients and
    optimizer state, hatched), activations at the peak, and what is left."""
    go = _go()
    devices = [m["device"] for m in ov.memory]
    fig = go.Figure()
    parts = (
        ("runtime reserve", "reserved_bytes", ""),
        ("parameters", "parameter_bytes", ""),
        *((("gradients", "gradient_bytes", "/"),
           ("optimizer state", "optimizer_state_bytes", "x")) if ov.training else ()),
        ("activations at peak", "activation_bytes", ""),
    )
    for label, key, hatch in parts:
        values = [m[key] for m in ov.memory]
        fig.add_trace(go.Bar(
            name=label, orientation="h", y=[_e(d) for d in devices],
            x=[v / m["capacity_bytes"] * 100 for v, m in zip(values, ov.memory)],
            marker=dict(color=PART_COLORS[label], line=dict(color="#ffffff", width=0.5),
                        **({"pattern": dict(shape=hatch, fgcolor="#ffffff", solidity=0.3)}
                           if hatch else {})),
            customdata=[format_bytes(v) for v in values],
            hovertemplate=label + ": %{customdata} (%{x:.2g}% of capacity)<extra>%{y}</extra>"))
    fig.add_trace(go.Bar(
        name="free", orientation="h", y=[_e(d) for d in devices],
        x=[max(100 - m["peak_bytes"] / m["capacity_bytes"] * 100, 0) for m in ov.memory],
        marker=dict(color=PART_COLORS["free"]), hoverinfo="skip",
        text=[f"peak {format_bytes(m['peak_bytes'])} of {format_bytes(m['capacity_bytes'])} "
              f"({format_share(m['fraction'])})" for m in ov.memory],
        textposition="inside", insidetextanchor="end", textfont=dict(color="#1f2328")))
    fig.update_layout(**_layout(
        height=110 + 34 * len(devices), barmode="stack",
        xaxis=dict(title=dict(text="% of capacity"), range=[0, max(100, *(
            m["fraction"] * 100 for m in ov.memory))]),
        yaxis=dict(autorange="reversed")))
    return fig


def _alpha(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


# ---------------------------------------------------------------------------------------------
# Comparison and solver progress


def comparison_figure(ov: Overview) -> Any:
    """The plan and every baseline on the same simulator: the objective's value, usually the
    makespan (left), and peak memory per device (right)."""
    go = _go()
    from plotly.subplots import make_subplots

    rows = [("autoplace plan", ov.value_s, True, 1.0,
             {m["device"]: m["peak_bytes"] for m in ov.memory})]
    rows += [(c.name, c.value_s, c.feasible, c.speedup, c.peak_bytes)
             for c in ov.comparisons if c.value_s is not None]
    spans = [r[1] for r in rows] + [ov.lower_bound_s]
    unit, scale = time_unit(max(spans))
    fig = make_subplots(rows=1, cols=2, column_widths=[0.48, 0.52], horizontal_spacing=0.14,
                        subplot_titles=(f"{ov.value_label.capitalize()} (lower is better)",
                                        "Peak memory per device"))
    names = [_e(r[0]) for r in rows]
    colors = [_PLAN_COLOR if i == 0 else (_BASELINE_COLOR if r[2] else "#e8a0a0")
              for i, r in enumerate(rows)]
    fig.add_trace(go.Bar(
        orientation="h", y=names, x=[r[1] * scale for r in rows], marker=dict(color=colors),
        showlegend=False, text=[
            "the plan" if i == 0 else (f"{r[3]:.2f}x the plan" if r[3] else "")
            + ("" if r[2] else " · exceeds memory") for i, r in enumerate(rows)],
        textposition="auto", customdata=[format_seconds(r[1]) for r in rows],
        hovertemplate="%{y}: %{customdata}<extra></extra>"), row=1, col=1)
    x_bound = ov.lower_bound_s * scale
    if ov.gap is not None:  # a tensor-parallel mesh's plan proves no bound
        fig.add_shape(type="line", x0=x_bound, x1=x_bound, y0=-0.5, y1=len(rows) - 0.5,
                      line=dict(color="#57606a", dash="dot", width=1), row=1, col=1)
        fig.add_annotation(x=x_bound, y=len(rows) - 0.5, text="lower bound", showarrow=False,
                           yanchor="bottom", font=dict(size=10, color="#57606a"), row=1, col=1)
    devices = [m["device"] for m in ov.memory]
    peak = max([b for r in rows for b in r[4].values()] + [1])
    b_unit, b_scale = bytes_unit(peak)
    for i, r in enumerate(rows):
        fig.add_trace(go.Bar(
            name=names[i], x=[_e(d) for d in devices],
            y=[r[4].get(d, 0) / b_scale for d in devices],
            marker=dict(color=_PLAN_COLOR if i == 0 else PALETTE[(i + 1) % len(PALETTE)]),
            customdata=[format_bytes(r[4].get(d, 0)) for d in devices],
            hovertemplate=names[i] + ": %{customdata}<extra>%{x}</extra>"), row=1, col=2)
    fig.update_layout(**_layout(height=150 + 30 * len(rows) + 60, barmode="group",
                                margin=dict(l=120, r=24, t=72, b=48),
                                legend=dict(orientation="v", x=1.0, xanchor="right", y=1)))
    fig.update_xaxes(title_text=f"time ({unit})", row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(title_text=b_unit, row=1, col=2)
    return fig


def progress_figure(plan: Plan) -> Any | None:
    """CP-SAT's objective (its best solution so far, in its own model) and proven bound against
    solver time, and the plan's value as the simulator scores it, dashed; or ``None`` when the
    plan did not record them. The title says which model the curve is the objective of
    (``_cpsat_model_lines``) and, where the plan sits above the curve's end, why
    (``_above_objective_lines``): they are values of two models, not of one."""
    progress = plan.solver.progress  # (t_s, objective_s or None, bound_s)
    if not progress:
        return None
    go = _go()
    measure = _measure(plan)
    found = [(t, obj) for t, obj, _ in progress if obj is not None]
    bounds = [(t, bound) for t, _, bound in progress]
    unit, scale = time_unit(max([v for _, v in found + bounds] + [plan.objective_s]))
    t_end = max(plan.solver.wall_s or 0.0, progress[-1][0])
    fig = go.Figure()
    for name, points, color in (
            (f"CP-SAT's objective: its model's {measure}", found, _PLAN_COLOR),
            (f"CP-SAT's proven bound on its model's {measure}", bounds, "#59a14f")):
        if not points:
            continue
        xs = [t for t, _ in points] + [t_end]
        ys = [v * scale for _, v in points] + [points[-1][1] * scale]
        fig.add_trace(go.Scatter(
            name=name, x=xs, y=ys, mode="lines+markers", line=dict(shape="hv", color=color),
            marker=dict(size=[6] * len(points) + [0]),
            hovertemplate=name + ": %{y:.4g} " + unit + " at %{x:.3g} s<extra></extra>"))
    fig.add_trace(go.Scatter(
        name=f"plan: simulated {measure} ({format_seconds(plan.objective_s)})", x=[0, t_end],
        y=[plan.objective_s * scale] * 2, mode="lines",
        line=dict(color="#57606a", dash="dash", width=1), hoverinfo="skip"))
    above = _above_objective_lines(plan, found[-1][1] if found else None)
    shapes, annotations = [], []
    if above:  # the distance, drawn where the curve ends: from the objective up to the plan
        low, high = found[-1][1] * scale, plan.objective_s * scale
        shapes.append(dict(type="line", xref="x", yref="y", x0=t_end, x1=t_end, y0=low,
                           y1=high, line=dict(color="#57606a", width=1.5)))
        annotations.append(dict(
            xref="x", yref="y", x=t_end, y=(low + high) / 2, xanchor="right", xshift=-4,
            showarrow=False, text=f"+{format_seconds(plan.objective_s - found[-1][1])}",
            bgcolor="rgba(255,255,255,0.85)", font=dict(size=10, color="#57606a")))
    model = _cpsat_model_lines(plan)
    top_px = 60 + 18 * len(model) + 16 * len(above)  # the legend's row, then the title's lines
    fig.update_layout(**_layout(
        height=256 + top_px, margin=dict(l=110, r=24, t=top_px, b=48), shapes=shapes,
        annotations=annotations,
        title=dict(text="<br>".join(_e(line) for line in model),
                   x=0, xref="paper", xanchor="left", y=0.97, yanchor="top",
                   font=dict(size=13),
                   subtitle=dict(text="<br>".join(_e(line) for line in above),
                                 font=dict(size=11, color="#57606a"))),
        xaxis=dict(title=dict(text="solver time (s)"), rangemode="tozero"),
        yaxis=dict(title=dict(text=f"{measure} ({unit})"))))
    return fig


def _measure(plan: Plan) -> str:
    return "largest device load" if plan.objective == Objective.THROUGHPUT else "makespan"


def _plan_graph(plan: Plan) -> str:
    return "the training step's graph" if plan.training is not None else "the folded graph"


def _cpsat_model_lines(plan: Plan) -> list[str]:
    """Which model CP-SAT's objective is of (``solve.cpsat``, ``solve.launcher``,
    ``SolverRecord.scope``), a line for the graph, then one for each thing it leaves to the
    simulator: ["CP-SAT's objective: the makespan of its model of the folded graph (34 nodes),",
    "which bounds the launcher's segment calls and handovers but does not schedule them"]."""
    scope = plan.solver.scope or {}
    nodes = len(plan.problem.graph.nodes)
    if scope.get("graph") == "coarsened":
        graph = (f"a coarsened graph ({scope.get('nodes')} nodes of "
                 f"{_plan_graph(plan)}'s {scope.get('folded_nodes', nodes)})")
    else:
        graph = f"{_plan_graph(plan)} ({scope.get('nodes', nodes)} nodes)"
    first = f"CP-SAT's objective: the {_measure(plan)} of its model of {graph}"
    looser = [model for model, _ in _only_bounded(plan)]
    if not looser:
        return [first]
    return [first + ",", "which " + looser[0], *("and " + model for model in looser[1:])]


def _only_bounded(plan: Plan) -> list[tuple[str, str]]:
    """What the simulator schedules and CP-SAT's latency model only bounds or leaves free, each
    as (what the model does, what the simulator does), in words that follow "which" and "the
    simulator". (The throughput model's loads are the simulator's: ``simulate.loads``.)"""
    if plan.objective == Objective.THROUGHPUT:
        return []
    problem, training = plan.problem, plan.training
    out = []
    if problem.launchers:
        out.append(("bounds the launcher's segment calls and handovers but does not schedule "
                    "them", "schedules the launcher's segment calls and handovers on its host "
                    "thread"))
    if problem.cluster.shared:
        out.append(("bounds the shared links by the bytes they carry",
                    "shares each shared link's bandwidth among the copies on it"))
    if (problem.pipeline_schedule is not None and training is not None
            and int(training.microbatches or 1) > 1):
        out.append(("leaves the micro-batches' order free", "runs each device's micro-batches "
                    f"in {problem.pipeline_schedule} order"))
    return out


def _above_objective_lines(plan: Plan, objective_s: float | None) -> list[str]:
    """Why the plan's simulated value sits above ``objective_s``, CP-SAT's last objective, a
    line for the distance and one for each reason; none where it does not: ["The plan's
    simulated makespan, 339 µs, is 49.0 µs (17%) above CP-SAT's last objective, 290 µs:", "the
    simulator schedules the launcher's segment calls and handovers on its host thread"]."""
    value_s = plan.objective_s
    if objective_s is None or value_s <= objective_s * (1 + 1e-6) + 1e-12:
        return []
    scope = plan.solver.scope or {}
    reasons: list[list[str]] = []  # each its lines
    if scope.get("graph") == "coarsened":
        reasons.append([f"the plan is expanded to {_plan_graph(plan)}'s "
                        f"{scope.get('folded_nodes', len(plan.problem.graph.nodes))} nodes and "
                        "simulated node by node"])
    if plan.min_gain is not None and plan.min_gain.single_device_chosen:
        reasons.append(["--min-gain kept the plan on one device"])
    simulator = [does for _, does in _only_bounded(plan)]
    if simulator:
        reasons.append(["the simulator " + simulator[0], *("and " + d for d in simulator[1:])])
    if not reasons:
        # Otherwise the model times a placement as the simulator does; it bounds memory only
        # (parameters plus the largest working set), so its own placement may overflow.
        reasons.append([f"the plan ({plan.solver.name}) is the best placement that fits "
                        "memory as the simulator counts it, which CP-SAT's model only bounds"])
    for lines in reasons[:-1]:
        lines[-1] += ";"
    excess_s = value_s - objective_s
    share = f" ({excess_s / objective_s:.0%})" if objective_s > 0 else ""
    return [f"The plan's simulated {_measure(plan)}, {format_seconds(value_s)}, is "
            f"{format_seconds(excess_s)}{share} above CP-SAT's last objective, "
            f"{format_seconds(objective_s)}:",
            *(line for lines in reasons for line in lines)]
