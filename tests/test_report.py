"""Tests for the report stage: the plan schema, the HTML page and the terminal summary.

The plan below is built by hand and is consistent with the simulator's rules, worked out here:

    a1    cuda:0  0.0 ms -> 2.0 ms     branch A
    b1    cuda:1  0.0 ms -> 2.5 ms     branch B, in parallel with A on the other GPU
    b1's 4 MiB output to cuda:0: 10 µs latency + 4 MiB / 25 GB/s = 177.77 µs,
          2.5 ms -> 2.67777 ms
    merge cuda:0  2.7 ms -> 3.5 ms     waits for the transfer (2.678 ms) and a1 (2.0 ms)
    head  cuda:0  3.5 ms -> 4.0 ms

So the makespan is 4.0 ms; everything on cuda:0 would take 2.0 + 2.5 + 0.8 + 0.5 = 5.8 ms.
"""

from __future__ import annotations

import colorsys
import copy
import json
import re
from html.parser import HTMLParser
from typing import Any

import jsonschema
import pytest

from autoplace.formats.plan import Plan
from autoplace.formats.plan_check import load_schema, validate_plan_dict
from autoplace.report import (
    format_bytes,
    format_seconds,
    overview,
    render_html,
    summary_text,
)
from autoplace.report.page import plotly_js

GIB = 2**30
MIB = 2**20
BANDWIDTH = 25e9
LATENCY = 10e-6


def make_plan() -> dict[str, Any]:
    transfer_bytes = 4 * MIB
    transfer_end = 2.5e-3 + LATENCY + transfer_bytes / BANDWIDTH

    def node(name: str, device: str, start: float, end: float, **kw: Any) -> dict[str, Any]:
        other = "cuda:1" if device == "cuda:0" else "cuda:0"
        return {
            "name": name,
            "ops": kw.get("ops", [f"aten.{name}"]),
            "module": kw.get("module", name),
            "device": device,
            "start_s": start,
            "end_s": end,
            "compute_s": {device: end - start, other: end - start},
            "memory_bytes": kw.get("memory_bytes", 256 * MIB),
            "output_bytes": kw.get("output_bytes", 4 * MIB),
            "cost_source": "analytic",
        }

    devices = [
        {
            "name": f"cuda:{i}",
            "type": "A100-40GB",
            "memory_bytes": 40 * GIB,
            "host": "localhost",
            "torch_device": f"cuda:{i}",
        }
        for i in range(2)
    ]
    return {
        "schema_version": 1,
        "model": "TwoBranch",
        "objective": "latency",
        "tracer": "export",
        "devices": devices,
        "links": [
            {
                "src": a,
                "dst": b,
                "bandwidth_bytes_per_s": BANDWIDTH,
                "latency_s": LATENCY,
                "kind": "nvlink",
            }
            for a, b in (("cuda:0", "cuda:1"), ("cuda:1", "cuda:0"))
        ],
        "nodes": [
            node(
                "a1", "cuda:0", 0.0, 2.0e-3, module="branch_a.0", ops=["aten.linear", "aten.relu"]
            ),
            node("b1", "cuda:1", 0.0, 2.5e-3, module="branch_b.0", memory_bytes=512 * MIB),
            node("merge", "cuda:0", 2.7e-3, 3.5e-3, module="merge"),
            node("head", "cuda:0", 3.5e-3, 4.0e-3, module="head", output_bytes=4096),
        ],
        "edges": [
            {"src": "a1", "dst": "merge", "bytes": 4 * MIB},
            {"src": "b1", "dst": "merge", "bytes": transfer_bytes},
            {"src": "merge", "dst": "head", "bytes": 4 * MIB},
        ],
        "colocate": [],
        "transfers": [
            {
                "src": "b1",
                "src_device": "cuda:1",
                "dst_device": "cuda:0",
                "bytes": transfer_bytes,
                "start_s": 2.5e-3,
                "end_s": transfer_end,
            }
        ],
        "makespan_s": 4.0e-3,
        "lower_bound_s": 3.6e-3,
        "solver": {
            "name": "cpsat",
            "status": "OPTIMAL",
            "wall_s": 0.42,
            "gap": 0.1,
            "objective_s": 4.0e-3,
            "time_limit_s": 30.0,
        },
        "baselines": {
            "single-device": {
                "makespan_s": 5.8e-3,
                "feasible": True,
                "peak_bytes": {"cuda:0": 1300 * MIB, "cuda:1": 0},
            },
            "round_robin": {
                "makespan_s": 6.1e-3,
                "feasible": True,
                "peak_bytes": {"cuda:0": 600 * MIB, "cuda:1": 700 * MIB},
            },
            "greedy_memory": {"makespan_s": None, "feasible": False, "peak_bytes": {}},
        },
        "best_single_device": {"device": "cuda:0", "makespan_s": 5.8e-3},
        "speedup_over_single": 5.8e-3 / 4.0e-3,
        "memory": {
            "cuda:0": {
                "peak_bytes": 780 * MIB,
                "capacity_bytes": 40 * GIB,
                "resident_bytes": 768 * MIB,
                "timeline": [[0.0, 772 * MIB], [2.0e-3, 776 * MIB], [3.5e-3, 780 * MIB]],
            },
            "cuda:1": {
                "peak_bytes": 516 * MIB,
                "capacity_bytes": 40 * GIB,
                "resident_bytes": 512 * MIB,
                "timeline": [[0.0, 516 * MIB], [transfer_end, 512 * MIB]],
            },
        },
        "coarsening": {"traced_ops": 9, "plan_nodes": 4, "steps": ["fuse elementwise chains"]},
        "verification": {"status": "passed", "detail": "outputs match", "max_abs_diff": 1.2e-6},
        "notes": ["cost model is analytic; run calibrate for measured costs"],
        "created": "2024-06-01T12:00:00+00:00",
        "autoplace_version": "0.1.0",
    }


def as_plan(data: dict[str, Any]) -> Plan:
    """The hand-built plan dictionary as the ``Plan`` the report renders."""
    return Plan.from_dict(data)


class _Tree(HTMLParser):
    """Just enough of a DOM: every element with its attributes, parent ids and classes, text."""

    VOID = {"meta", "br", "link", "img", "input", "hr", "col", "source", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[dict[str, Any]] = []
        self.stack: list[dict[str, Any]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = {"tag": tag, "attrs": dict(attrs), "ancestors": list(self.stack), "text": ""}
        self.elements.append(element)
        if tag not in self.VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append(
            {"tag": tag, "attrs": dict(attrs), "ancestors": list(self.stack), "text": ""}
        )

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i]["tag"] == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        for element in self.stack:
            element["text"] += data

    def find(self, *, tag: str | None = None, within_id: str | None = None) -> list[dict]:
        out = []
        for e in self.elements:
            if tag is not None and e["tag"] != tag:
                continue
            if within_id is not None and not any(
                a["attrs"].get("id") == within_id for a in e["ancestors"]
            ):
                continue
            out.append(e)
        return out

    def by_id(self, element_id: str) -> dict[str, Any]:
        (element,) = [e for e in self.elements if e["attrs"].get("id") == element_id]
        return element


def parse(page: str) -> _Tree:
    tree = _Tree()
    tree.feed(page)
    tree.close()
    return tree


# --- the hand-built plan obeys the rules the schema documents --------------------------------


def test_hand_built_plan_is_consistent() -> None:
    plan = make_plan()
    links = {(lk["src"], lk["dst"]): lk for lk in plan["links"]}
    nodes = {n["name"]: n for n in plan["nodes"]}
    for n in plan["nodes"]:
        assert n["end_s"] - n["start_s"] == pytest.approx(n["compute_s"][n["device"]])
    for e in plan["edges"]:
        src, dst = nodes[e["src"]], nodes[e["dst"]]
        delay = 0.0
        if src["device"] != dst["device"]:
            link = links[(src["device"], dst["device"])]
            delay = link["latency_s"] + e["bytes"] / link["bandwidth_bytes_per_s"]
        assert dst["start_s"] >= src["end_s"] + delay - 1e-12


# --- schema ------------------------------------------------------------------------------------


def test_schema_loads_and_is_valid_draft_2020_12() -> None:
    schema = load_schema()
    assert schema["$schema"].endswith("2020-12/schema")
    jsonschema.Draft202012Validator.check_schema(schema)


def test_valid_plan_passes_and_survives_json_round_trip() -> None:
    plan = json.loads(json.dumps(make_plan()))
    validate_plan_dict(plan)


def test_plan_without_makespan_fails() -> None:
    plan = make_plan()
    del plan["makespan_s"]
    with pytest.raises(ValueError, match="'makespan_s' is a required property"):
        validate_plan_dict(plan)


def test_node_without_device_fails_with_its_path() -> None:
    plan = make_plan()
    del plan["nodes"][2]["device"]
    with pytest.raises(ValueError, match=r"plan\.nodes\[2\]: 'device' is a required property"):
        validate_plan_dict(plan)


def test_wrong_types_fail() -> None:
    plan = make_plan()
    plan["nodes"][0]["memory_bytes"] = "256MiB"
    plan["tracer"] = "jit"
    with pytest.raises(ValueError, match=r"2 problems") as info:
        validate_plan_dict(plan)
    assert "plan.nodes[0].memory_bytes" in str(info.value)
    assert "plan.tracer" in str(info.value)


def test_node_on_unknown_device_fails() -> None:
    plan = make_plan()
    plan["nodes"][1]["device"] = "cuda:7"
    plan["nodes"][1]["compute_s"]["cuda:7"] = 1e-3
    with pytest.raises(ValueError, match=r"plan\.nodes\[1\]\.device: 'cuda:7' is not one of"):
        validate_plan_dict(plan)


# --- HTML --------------------------------------------------------------------------------------


def figures(page: str) -> dict[str, dict[str, Any]]:
    """The plotly figures a page embeds, by the id of the element each is drawn in."""
    blocks = re.findall(r'<script type="application/json" data-chart="([^"]+)">(.*?)</script>',
                        page, re.S)
    return {chart: json.loads(body) for chart, body in blocks}


def test_page_has_the_sections_and_charts_by_id() -> None:
    page = render_html(as_plan(make_plan()))
    tree = parse(page)
    for element_id in ("summary", "timeline", "memory", "memory-peak", "comparison",
                       "baselines", "modules", "devices"):
        tree.by_id(element_id)
    assert set(figures(page)) == {"timeline", "memory", "memory-peak", "comparison"}


def test_timeline_has_one_bar_per_node_a_lane_per_device_and_the_transfer() -> None:
    plan = make_plan()
    fig = figures(render_html(as_plan(plan)))["timeline"]
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    assert [t["name"] for t in bars] == ["cuda:0", "cuda:1"]
    assert sum(len(t["base"]) for t in bars) == len(plan["nodes"])
    hover = [row[0] for t in bars for row in t["customdata"]]
    assert sorted(hover) == sorted(n["name"] for n in plan["nodes"])
    assert "module" in bars[0]["hovertemplate"] and "ops" in bars[0]["hovertemplate"]
    assert "cuda:0" in fig["layout"]["yaxis"]["ticktext"][0]
    (transfer,) = [t for t in fig["data"] if "transfer" in t["name"]]
    assert transfer["name"] == "critical transfer"  # b1's output is what merge waits for
    # One segment, from b1's end on cuda:1 (lane 1) to its arrival on cuda:0 (lane 0), in ms.
    assert transfer["x"][:2] == pytest.approx([2.5, (2.5e-3 + LATENCY + 4 * MIB / BANDWIDTH)
                                               * 1e3])
    assert transfer["y"][0] > transfer["y"][1]


def test_parallel_branches_overlap_in_time_on_different_lanes() -> None:
    fig = figures(render_html(as_plan(make_plan())))["timeline"]
    start = {}
    for t in fig["data"]:
        if t["type"] == "bar":
            for name, y, base in zip((r[0] for r in t["customdata"]), t["y"], t["base"]):
                start[name] = (y, base)
    assert start["a1"][0] != start["b1"][0]
    assert start["a1"][1] == start["b1"][1] == 0  # both start at t = 0, side by side


def test_critical_path_is_highlighted_on_the_timeline() -> None:
    fig = figures(render_html(as_plan(make_plan())))["timeline"]
    edged = {}
    for t in fig["data"]:
        if t["type"] == "bar":
            for row, width in zip(t["customdata"], t["marker"]["line"]["width"]):
                edged[row[0]] = width > 1
    assert edged == {"a1": False, "b1": True, "merge": True, "head": True}
    assert any(t["name"] == "critical path" for t in fig["data"])


def test_page_is_self_contained() -> None:
    page = render_html(as_plan(make_plan()))
    tree = parse(page)
    scripts = tree.find(tag="script")
    assert scripts and not [e for e in scripts if "src" in e["attrs"]]
    assert not tree.find(tag="link")
    assert not tree.find(tag="img")
    assert not tree.find(tag="iframe")
    assert tree.find(tag="style")
    assert page.count(plotly_js()) == 1  # the library itself, once


def test_text_from_the_plan_is_escaped() -> None:
    plan = make_plan()
    plan["nodes"][0]["module"] = "<evil>"
    plan["nodes"][1]["name"] = "</script><script>alert(2)</script>"
    for e in plan["edges"] + plan["transfers"]:
        if e["src"] == "b1":
            e["src"] = plan["nodes"][1]["name"]
    plan["model"] = 'x"><script>alert(1)</script>'
    page = render_html(as_plan(plan))
    assert "<evil>" not in page and "alert(1)</script>" not in page
    assert "alert(2)</script>" not in page
    tree = parse(page)
    assert not tree.find(tag="evil")
    # Only the page's own scripts: the chart data blocks, plotly.js and the page script.
    scripts = tree.find(tag="script")
    assert len(scripts) == len(figures(page)) + 2
    labels = [e["text"] for e in tree.find(tag="td", within_id="modules")]
    assert any("<evil>" in text for text in labels)  # shown to the reader as written
    fig = figures(page)["timeline"]
    assert any("&lt;evil&gt;" in str(t.get("customdata")) for t in fig["data"])


def test_baselines_table_has_a_row_per_baseline_and_the_plan() -> None:
    plan = make_plan()
    page = render_html(as_plan(plan))
    tree = parse(page)
    rows = tree.find(tag="tr", within_id="baselines")
    body_rows = [r for r in rows if not any(a["tag"] == "thead" for a in r["ancestors"])]
    assert len(body_rows) == len(plan["baselines"]) + 1
    text = " ".join(r["text"] for r in body_rows)
    assert "1.45×" in text  # single-device, 5.8 ms against the plan's 4.0 ms
    comparison = figures(page)["comparison"]
    makespans = comparison["data"][0]
    # greedy_memory could not be scheduled: only the plan and two baselines have a bar.
    assert makespans["y"] == ["autoplace plan", "single-device", "round_robin"]


def test_summary_gives_speedup_over_each_baseline_bound_gap_and_costs() -> None:
    tree = parse(render_html(as_plan(make_plan())))
    summary = tree.by_id("summary")["text"]
    assert "1.45×" in summary and "round_robin 1.53×" in summary
    assert "3.60 ms" in summary and "gap 10.0%" in summary
    assert "OPTIMAL" in summary and "420 ms" in summary
    assert "analytic" in summary


def test_cost_sources_are_counted_and_default_to_analytic() -> None:
    plan = make_plan()
    plan["nodes"][0]["cost_source"] = "measured"
    del plan["nodes"][1]["cost_source"]
    assert overview(as_plan(plan)).costs_text == "3 analytic, 1 measured"
    plan["nodes"][0]["cost_source"] = "analytic"
    assert overview(as_plan(plan)).costs_text == "analytic"


def test_memory_chart_has_a_curve_and_a_capacity_line_per_device() -> None:
    fig = figures(render_html(as_plan(make_plan())))["memory"]
    curves = [t for t in fig["data"] if not t["name"].endswith("capacity")]
    caps = [t for t in fig["data"] if t["name"].endswith("capacity")]
    assert [t["name"] for t in curves] == ["cuda:0", "cuda:1"]
    # The axis is in MiB, the unit of the peaks (capacity is far above them).
    assert len(caps) == 2 and caps[0]["y"] == [40 * 1024, 40 * 1024]
    assert curves[0]["line"]["shape"] == "hv"
    assert curves[0]["y"] == pytest.approx([772, 776, 780, 780])  # three steps, held to the end
    assert curves[0]["x"][-1] == pytest.approx(4.0)  # ms
    buttons = fig["layout"]["updatemenus"][0]["buttons"]
    assert [b["label"] for b in buttons] == ["zoom to usage", "show capacity"]


def legend_colors(fig: dict[str, Any]) -> dict[str, str]:
    """Each legend entry of a chart and its colour. A trace's marker colour must be one colour:
    given a list, plotly's legend draws the first and a reader cannot tell the entries apart."""
    colors = {t["name"]: t["marker"]["color"] for t in fig["data"]}
    assert all(isinstance(c, str) for c in colors.values()), colors
    return colors


def assert_parts_have_distinct_colors(fig: dict[str, Any]) -> None:
    """Every part of the peak-memory chart its own colour, the parts' hues 30 degrees apart or
    more, and what is left a light grey."""
    colors = legend_colors(fig)
    assert len(set(colors.values())) == len(colors), colors
    hls = {name: colorsys.rgb_to_hls(*(int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)))
           for name, c in colors.items()}
    assert hls.pop("free")[1] > 0.85
    assert all(s > 0.2 for _, _, s in hls.values()), colors  # a hue, not a grey
    hues = [h * 360 for h, _, _ in hls.values()]
    for i, a in enumerate(hues):
        for b in hues[i + 1:]:
            assert min(abs(a - b), 360 - abs(a - b)) >= 30, colors


def test_every_part_of_the_peak_memory_chart_has_a_colour_of_its_own() -> None:
    fig = figures(render_html(as_plan(make_plan())))["memory-peak"]
    assert list(legend_colors(fig)) == ["runtime reserve", "parameters", "activations at peak",
                                        "free"]
    assert_parts_have_distinct_colors(fig)


def _progress_plan(objective_s: float, **solver: Any) -> dict[str, Any]:
    """The hand-built plan with CP-SAT's progress recorded, its last objective ``objective_s``
    (the plan's simulated makespan is 4.0 ms)."""
    plan = make_plan()
    plan["solver"]["progress"] = [
        {"t_s": 0.01, "objective_s": None, "bound_s": 3.0e-3},
        {"t_s": 0.05, "objective_s": 4.4e-3, "bound_s": 3.0e-3},
        {"t_s": 0.30, "objective_s": objective_s, "bound_s": 3.0e-3},
    ]
    plan["solver"]["objective_s"] = objective_s
    plan["solver"].update(solver)
    return plan


def test_solver_progress_is_charted_when_recorded_and_noted_when_not() -> None:
    plan = make_plan()
    page = render_html(as_plan(plan))
    assert "progress" not in figures(page)
    assert parse(page).by_id("progress-missing")["text"] == "solver progress not recorded"
    fig = figures(render_html(as_plan(_progress_plan(4.0e-3))))["progress"]
    objective, bound, simulated = fig["data"]
    assert objective["name"] == "CP-SAT's objective: its model's makespan"
    assert bound["name"] == "CP-SAT's proven bound on its model's makespan"
    assert simulated["name"] == "plan: simulated makespan (4.00 ms)"
    assert objective["y"][:2] == pytest.approx([4.4, 4.0])  # ms
    assert bound["y"][:3] == pytest.approx([3.0, 3.0, 3.0])
    assert objective["x"][-1] == pytest.approx(0.42)  # held to the solver's end
    assert simulated["y"] == pytest.approx([4.0, 4.0])


def test_solver_progress_says_which_model_its_objective_is_of() -> None:
    # CPUs, the folded graph solved whole: CP-SAT's model is the simulator's, and the plan
    # meets its objective, so there is nothing to explain.
    fig = figures(render_html(as_plan(_progress_plan(
        4.0e-3, scope={"graph": "folded", "nodes": 4, "folded_nodes": 4}))))["progress"]
    title = fig["layout"]["title"]
    assert title["text"] == ("CP-SAT's objective: the makespan of its model of the folded "
                             "graph (4 nodes)")
    assert not title.get("subtitle", {}).get("text")
    assert not fig["layout"].get("annotations")
    # A coarsened graph: the curve is of 2 coarse nodes, the plan of the 4 folded ones, 1 ms
    # above it.
    fig = figures(render_html(as_plan(_progress_plan(
        3.0e-3, scope={"graph": "coarsened", "nodes": 2, "folded_nodes": 4,
                       "status": "OPTIMAL"}))))["progress"]
    title = fig["layout"]["title"]
    assert title["text"] == ("CP-SAT's objective: the makespan of its model of a coarsened "
                             "graph (2 nodes of the folded graph's 4)")
    assert title["subtitle"]["text"] == (
        "The plan's simulated makespan, 4.00 ms, is 1.00 ms (33%) above CP-SAT's last "
        "objective, 3.00 ms:<br>the plan is expanded to the folded graph's 4 nodes and "
        "simulated node by node")
    (gap,) = fig["layout"]["annotations"]
    assert gap["text"] == "+1.00 ms"
    (line,) = fig["layout"]["shapes"]
    assert (line["y0"], line["y1"]) == pytest.approx((3.0, 4.0))


def test_solver_progress_on_gpus_says_the_launcher_is_only_bounded() -> None:
    # GPUs launched from one host thread: CP-SAT's model bounds the segment calls and
    # handovers, the simulator schedules them, so the plan sits above CP-SAT's objective.
    plan = _progress_plan(3.2e-3, scope={"graph": "folded", "nodes": 4, "folded_nodes": 4},
                          name="balanced + local moves", status="FEASIBLE")
    plan["host"] = {"call_s": {"cuda:0": 1e-5, "cuda:1": 1e-5},
                    "handover_s": {"cuda:0": 2e-5, "cuda:1": 2e-5}}
    fig = figures(render_html(as_plan(plan)))["progress"]
    title = fig["layout"]["title"]
    assert title["text"] == (
        "CP-SAT's objective: the makespan of its model of the folded graph (4 nodes),<br>"
        "which bounds the launcher's segment calls and handovers but does not schedule them")
    assert title["subtitle"]["text"] == (
        "The plan's simulated makespan, 4.00 ms, is 800 µs (25%) above CP-SAT's last "
        "objective, 3.20 ms:<br>the simulator schedules the launcher's segment calls and "
        "handovers on its host thread")
    # Where the plan meets the objective, the chart says what the model is and no more.
    plan["solver"]["progress"][-1]["objective_s"] = 4.0e-3
    title = figures(render_html(as_plan(plan)))["progress"]["layout"]["title"]
    assert "launcher" in title["text"] and not title["subtitle"]["text"]


def test_whatif_table_lists_every_device_count() -> None:
    plan = make_plan()
    assert parse(render_html(as_plan(plan))).by_id("whatif-missing")
    plan["whatif"] = [
        {"devices": ["cuda:0"], "makespan_s": 5.8e-3, "status": "OPTIMAL", "detail": ""},
        {"devices": ["cuda:0", "cuda:1"], "makespan_s": 4.0e-3, "status": "OPTIMAL",
         "detail": "the plan"},
    ]
    validate_plan_dict(plan)
    tree = parse(render_html(as_plan(plan)))
    rows = [r["text"] for r in tree.find(tag="tr", within_id="whatif")][1:]
    assert len(rows) == 2
    assert "5.80 ms" in rows[0] and "1.00x" in rows[0]
    assert "4.00 ms" in rows[1] and "1.45x" in rows[1]


def test_whatif_row_that_does_not_fit_says_so() -> None:
    plan = make_plan()
    plan["whatif"] = [
        {"devices": ["cuda:0"], "makespan_s": None, "status": "INFEASIBLE",
         "detail": "needs 41.2 GiB, cuda:0 has 40.0 GiB"},
        {"devices": ["cuda:0", "cuda:1"], "makespan_s": 4.0e-3, "status": "OPTIMAL"},
    ]
    validate_plan_dict(plan)
    rows = [r["text"] for r in parse(render_html(as_plan(plan))).find(tag="tr", within_id="whatif")]
    assert "does not fit" in rows[1] and "needs 41.2 GiB" in rows[1]
    assert "n/a" in rows[2]  # no speed-up over a row that has no makespan


def test_module_tree_rolls_time_and_bytes_up_and_is_searchable() -> None:
    page = render_html(as_plan(make_plan()))
    tree = parse(page)
    assert tree.by_id("module-search")["tag"] == "input"
    rows = [r for r in tree.find(tag="tr", within_id="modules") if "data-key" in r["attrs"]]
    root = rows[0]["attrs"]
    assert root["data-label"] == "TwoBranch" and root["data-nodes"] == "4"
    assert float(root["data-time"]) == pytest.approx(5.8e-3)
    assert int(root["data-params"]) == 4 * 256 * MIB + 256 * MIB  # b1 has 512 MiB
    headers = [th["attrs"].get("data-sort") for th in tree.find(tag="th", within_id="modules")]
    assert {"tree", "devices", "time", "params", "output"} <= set(headers)


def test_page_renders_without_optional_fields() -> None:
    plan = make_plan()
    for key in ("coarsening", "verification", "notes"):
        del plan[key]
    for mem in plan["memory"].values():
        del mem["timeline"]
    plan["best_single_device"] = {"device": None, "makespan_s": None}
    plan["speedup_over_single"] = None
    plan["solver"]["gap"] = None
    page = render_html(as_plan(plan))
    parse(page).by_id("timeline")
    # Without a stored timeline the memory curve comes from re-simulating the placement.
    curve = figures(page)["memory"]["data"][0]
    assert len(curve["y"]) > 2
    assert "n/a" in summary_text(as_plan(plan))


def test_page_for_200_nodes_stays_small() -> None:
    plan = make_plan()
    template = plan["nodes"][0]
    nodes = []
    for i in range(200):
        device = f"cuda:{i % 2}"
        start = (i // 2) * 1e-4
        n = copy.deepcopy(template)
        n.update(
            name=f"layers.{i}.mlp.fc", module=f"model.layers.{i}.mlp", device=device,
            start_s=start, end_s=start + 1e-4, compute_s={"cuda:0": 1e-4, "cuda:1": 1e-4},
        )  # fmt: skip
        nodes.append(n)
    plan["nodes"] = nodes
    plan["edges"] = []
    plan["transfers"] = []
    plan["makespan_s"] = 100 * 1e-4
    plan["memory"]["cuda:0"]["timeline"] = [[i * 1e-5, 2**30 + i * 4096] for i in range(1000)]
    page = render_html(as_plan(plan))
    assert len(page.encode("utf-8")) - len(plotly_js().encode("utf-8")) < 1_000_000
    bars = [t for t in figures(page)["timeline"]["data"] if t["type"] == "bar"]
    assert sum(len(t["base"]) for t in bars) == 200


def test_vendored_plotly_matches_the_python_package() -> None:
    # The figures are built with the Python package and drawn by the vendored bundle: the two
    # must speak the same plotly.js major version.
    from plotly.offline import get_plotlyjs_version

    vendored = re.search(r"plotly\.js \(basic - minified\) v(\d+)\.", plotly_js()[:300])
    assert vendored and vendored.group(1) == get_plotlyjs_version().split(".")[0]


# --- text --------------------------------------------------------------------------------------


def test_summary_mentions_makespan_devices_baselines_and_verification() -> None:
    text = summary_text(as_plan(make_plan()))
    assert "makespan" in text and "4.00 ms" in text
    assert "cuda:0" in text and "cuda:1" in text
    assert "1.45x" in text
    assert "780 MiB / 40.0 GiB" in text
    for name in ("single-device", "round_robin", "greedy_memory"):
        assert name in text
    assert "passed" in text


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1536, "1.50 KiB"),
        (780 * MIB, "780 MiB"),
        (40 * GIB, "40.0 GiB"),
    ],
)
def test_format_bytes(n: int, expected: str) -> None:
    assert format_bytes(n) == expected


@pytest.mark.parametrize(
    ("s", "expected"),
    [(0, "0 s"), (4.2e-5, "42.0 µs"), (0.0123, "12.3 ms"), (1.5, "1.50 s"), (None, "n/a")],
)
def test_format_seconds(s: float | None, expected: str) -> None:
    assert format_seconds(s) == expected
