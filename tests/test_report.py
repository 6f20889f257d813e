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

import copy
import json
from html.parser import HTMLParser
from typing import Any

import pytest

from autoplace.report import (
    format_bytes,
    format_seconds,
    load_schema,
    render_html,
    summary_text,
    validate_plan_dict,
)

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
            "single:cuda:0": {
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
    jsonschema = pytest.importorskip("jsonschema")
    schema = load_schema()
    assert schema["$schema"].endswith("2020-12/schema")
    jsonschema.Draft202012Validator.check_schema(schema)


def test_valid_plan_passes_and_survives_json_round_trip() -> None:
    pytest.importorskip("jsonschema")
    plan = json.loads(json.dumps(make_plan()))
    validate_plan_dict(plan)


def test_plan_without_makespan_fails() -> None:
    pytest.importorskip("jsonschema")
    plan = make_plan()
    del plan["makespan_s"]
    with pytest.raises(ValueError, match="'makespan_s' is a required property"):
        validate_plan_dict(plan)


def test_node_without_device_fails_with_its_path() -> None:
    pytest.importorskip("jsonschema")
    plan = make_plan()
    del plan["nodes"][2]["device"]
    with pytest.raises(ValueError, match=r"plan\.nodes\[2\]: 'device' is a required property"):
        validate_plan_dict(plan)


def test_wrong_types_fail() -> None:
    pytest.importorskip("jsonschema")
    plan = make_plan()
    plan["nodes"][0]["memory_bytes"] = "256MiB"
    plan["tracer"] = "jit"
    with pytest.raises(ValueError, match=r"2 problems") as info:
        validate_plan_dict(plan)
    assert "plan.nodes[0].memory_bytes" in str(info.value)
    assert "plan.tracer" in str(info.value)


def test_node_on_unknown_device_fails() -> None:
    pytest.importorskip("jsonschema")
    plan = make_plan()
    plan["nodes"][1]["device"] = "cuda:7"
    plan["nodes"][1]["compute_s"]["cuda:7"] = 1e-3
    with pytest.raises(ValueError, match=r"plan\.nodes\[1\]\.device: 'cuda:7' is not one of"):
        validate_plan_dict(plan)


# --- HTML --------------------------------------------------------------------------------------


def test_page_has_the_charts_by_id() -> None:
    tree = parse(render_html(make_plan()))
    for element_id in ("timeline", "memory", "baselines"):
        tree.by_id(element_id)


def test_timeline_has_one_bar_per_node_and_a_lane_per_device() -> None:
    plan = make_plan()
    tree = parse(render_html(plan))
    bars = [
        e
        for e in tree.find(tag="rect", within_id="timeline")
        if any(a["attrs"].get("class") == "node" for a in e["ancestors"])
    ]
    assert len(bars) == len(plan["nodes"])
    titles = [e["text"] for e in tree.find(tag="title", within_id="timeline")]
    for n in plan["nodes"]:
        assert any(t.startswith(n["name"] + "\n") for t in titles)
    lane_text = " ".join(e["text"] for e in tree.find(tag="text", within_id="timeline"))
    assert "cuda:0" in lane_text and "cuda:1" in lane_text
    transfers = [
        g for g in tree.find(tag="g", within_id="timeline") if g["attrs"]["class"] == "transfer"
    ]
    assert len(transfers) == 1


def test_parallel_branches_overlap_in_time_on_different_lanes() -> None:
    tree = parse(render_html(make_plan()))
    bars = {}
    for g in tree.find(tag="g", within_id="timeline"):
        if g["attrs"].get("class") != "node":
            continue
        (rect,) = [e for e in tree.elements if e["tag"] == "rect" and g in e["ancestors"]]
        bars[g["text"].split("\n")[0]] = rect["attrs"]
    a1, b1 = bars["a1"], bars["b1"]
    assert a1["y"] != b1["y"]
    assert float(a1["x"]) == float(b1["x"])  # both start at t = 0, side by side


def test_page_is_self_contained() -> None:
    page = render_html(make_plan())
    tree = parse(page)
    assert "http://" not in page and "https://" not in page
    assert not [e for e in tree.find(tag="script") if "src" in e["attrs"]]
    assert not tree.find(tag="link")
    assert not tree.find(tag="img")
    assert tree.find(tag="style")


def test_text_from_the_plan_is_escaped() -> None:
    plan = make_plan()
    plan["nodes"][0]["module"] = "<evil>"
    plan["model"] = 'x"><script>alert(1)</script>'
    page = render_html(plan)
    assert "<evil>" not in page
    assert "&lt;evil&gt;" in page
    tree = parse(page)
    assert not tree.find(tag="evil")
    assert not tree.find(tag="script")
    codes = [e["text"] for e in tree.find(tag="code")]
    assert "<evil>" in codes  # shown to the reader as written


def test_baselines_table_has_a_row_per_baseline_and_the_plan() -> None:
    plan = make_plan()
    tree = parse(render_html(plan))
    rows = tree.find(tag="tr", within_id="baselines")
    body_rows = [r for r in rows if not any(a["tag"] == "thead" for a in r["ancestors"])]
    assert len(body_rows) == len(plan["baselines"]) + 1
    text = " ".join(r["text"] for r in body_rows)
    assert "1.45×" in text  # single:cuda:0, 5.8 ms against the plan's 4.0 ms


def test_memory_section_has_a_bar_and_curve_per_device() -> None:
    tree = parse(render_html(make_plan()))
    svgs = tree.find(tag="svg", within_id="memory")
    assert len(svgs) == 4
    assert len(tree.find(tag="polyline", within_id="memory")) == 2


def test_page_renders_without_optional_fields() -> None:
    plan = make_plan()
    for key in ("coarsening", "verification", "notes"):
        del plan[key]
    for mem in plan["memory"].values():
        del mem["timeline"]
    plan["best_single_device"] = {"device": None, "makespan_s": None}
    plan["speedup_over_single"] = None
    plan["solver"]["gap"] = None
    tree = parse(render_html(plan))
    tree.by_id("timeline")
    assert "n/a" in summary_text(plan)


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
    plan["makespan_s"] = 100 * 1e-4
    plan["memory"]["cuda:0"]["timeline"] = [[i * 1e-5, 2**30 + i * 4096] for i in range(1000)]
    page = render_html(plan)
    assert len(page.encode("utf-8")) < 1_000_000
    tree = parse(page)
    bars = [
        e
        for e in tree.find(tag="rect", within_id="timeline")
        if any(a["attrs"].get("class") == "node" for a in e["ancestors"])
    ]
    assert len(bars) == 200


# --- text --------------------------------------------------------------------------------------


def test_summary_mentions_makespan_devices_baselines_and_verification() -> None:
    text = summary_text(make_plan())
    assert "makespan" in text and "4.00 ms" in text
    assert "cuda:0" in text and "cuda:1" in text
    assert "1.45x" in text
    assert "780 MiB / 40.0 GiB" in text
    for name in ("single:cuda:0", "round_robin", "greedy_memory"):
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
