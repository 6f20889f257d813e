"""What the report says, checked on the hand-built two-branch plan of ``test_report``:

    a1    cuda:0  0.0 -> 2.0 ms       b1    cuda:1  0.0 -> 2.5 ms
    b1's output to cuda:0: 2.5 -> 2.678 ms
    merge cuda:0  2.7 -> 3.5 ms       head  cuda:0  3.5 -> 4.0 ms

merge waits for b1's transfer (2.678 ms), not for a1 (2.0 ms), so the critical path is
b1 -> transfer -> merge -> head: 2.5 + 0.178 + 0.8 + 0.5 ms of work and 22 µs idle = 4.0 ms.
"""

from __future__ import annotations

import json
import os

import pytest
from test_report import as_plan, make_plan

from autoplace.report import (
    critical_path,
    module_tree,
    overview,
    render_markdown,
    summary_text,
    write_report,
)
from autoplace.report import page as page_module


def test_critical_path_follows_the_transfer_merge_waited_for() -> None:
    path = critical_path(as_plan(make_plan()))
    assert [(s.kind, s.name) for s in path] == [
        ("node", "b1"), ("transfer", "b1"), ("node", "merge"), ("node", "head")]
    assert path[1].src_device == "cuda:1" and path[1].dst_device == "cuda:0"
    assert path[0].start_s == 0 and path[-1].end_s == pytest.approx(4.0e-3)


def test_critical_path_follows_the_device_when_a_node_waits_for_its_lane() -> None:
    # head runs after merge on cuda:0 but reads nothing from it: it waited for the device.
    plan = make_plan()
    plan["edges"] = [e for e in plan["edges"] if e["dst"] != "head"]
    assert [s.name for s in critical_path(as_plan(plan))][-2:] == ["merge", "head"]


def test_critical_path_of_one_chain_is_every_node() -> None:
    plan = make_plan()
    for n in plan["nodes"]:
        n["device"] = "cuda:0"
    t = 0.0
    for n in plan["nodes"]:
        n["start_s"], n["end_s"] = t, t + (n["end_s"] - n["start_s"])
        t = n["end_s"]
    plan["makespan_s"] = t
    plan["transfers"] = []
    plan["edges"].append({"src": "a1", "dst": "b1", "bytes": 1})
    assert [s.name for s in critical_path(as_plan(plan))] == ["a1", "b1", "merge", "head"]


def test_overview_compares_against_every_baseline() -> None:
    ov = overview(as_plan(make_plan()))
    assert [c.name for c in ov.comparisons] == ["single-device", "round_robin", "greedy_memory"]
    assert ov.comparisons[0].speedup == pytest.approx(1.45)
    assert ov.comparisons[2].speedup is None and not ov.comparisons[2].feasible
    assert ov.gap == pytest.approx(0.1)
    assert ov.devices_text == "2x A100-40GB"
    assert ov.critical_compute_s == pytest.approx(3.8e-3)


def test_overview_of_a_throughput_plan_compares_loads() -> None:
    plan = make_plan()
    plan["objective"] = "throughput"
    plan["loads"] = {"cuda:0": 3.0e-3, "cuda:1": 2.7e-3}  # the plan's value is the largest
    for name, load in (("single-device", 5.8e-3), ("round_robin", 3.3e-3)):
        plan["baselines"][name]["max_load_s"] = load
    ov = overview(as_plan(plan))
    assert ov.value_label == "largest device load" and ov.value_s == 3.0e-3
    assert ov.comparisons[0].name == "round_robin"
    assert ov.comparisons[0].speedup == pytest.approx(1.1)
    assert "largest device load" in summary_text(as_plan(plan))
    plan["whatif"] = [
        {"devices": ["cuda:0"], "makespan_s": 5.8e-3, "objective_s": 5.8e-3, "status": "OPTIMAL"},
        {"devices": ["cuda:0", "cuda:1"], "makespan_s": 4.0e-3, "objective_s": 3.0e-3,
         "status": "OPTIMAL"}]
    rows = overview(as_plan(plan)).whatif
    assert [r.value_s for r in rows] == [5.8e-3, 3.0e-3]
    assert rows[1].speedup_over_first == pytest.approx(5.8 / 3.0)
    assert "| 2: cuda:0, cuda:1 | 3.00 ms | 1.93x | OPTIMAL |" in render_markdown(as_plan(plan))


def test_module_tree_is_preorder_in_execution_order_with_rollups() -> None:
    plan = make_plan()
    plan["nodes"][0]["module"] = "branch_a.0"
    plan["nodes"][1]["module"] = "branch_b.0"
    planned = as_plan(plan)
    rows = module_tree(planned, critical_path(planned))
    assert [(r.depth, r.label) for r in rows] == [
        (0, "TwoBranch"),
        (1, "branch_a"), (2, "0"), (3, "a1"),
        (1, "branch_b"), (2, "0"), (3, "b1"),
        (1, "merge"), (2, "merge"),
        (1, "head"), (2, "head"),
    ]
    root = rows[0]
    assert root.time_s == pytest.approx(5.8e-3) and root.nodes == 4
    assert dict(root.devices) == pytest.approx({"cuda:0": 3.3 / 5.8, "cuda:1": 2.5 / 5.8})
    assert root.devices_text == "cuda:0 57%, cuda:1 43%"
    b1 = next(r for r in rows if r.label == "b1")
    assert b1.kind == "node" and b1.critical and b1.param_bytes == 512 * 2**20
    assert b1.parent == "m:branch_b.0"
    assert not next(r for r in rows if r.label == "a1").critical


def test_markdown_summary_has_the_tables_and_escapes_pipes() -> None:
    plan = make_plan()
    plan["model"] = "a|b"
    plan["whatif"] = [{"devices": ["cuda:0"], "makespan_s": 5.8e-3, "status": "OPTIMAL"},
                      {"devices": ["cuda:0", "cuda:1"], "makespan_s": 4.0e-3,
                       "status": "OPTIMAL", "detail": "the plan"}]
    md = render_markdown(as_plan(plan))
    assert md.startswith("### autoplace plan for `a\\|b`")
    assert "| **makespan** | **4.00 ms** |" in md
    assert "| single-device | 5.80 ms | 1.45x | yes |" in md
    assert "| greedy_memory | not scheduled | n/a | no |" in md
    assert "| cuda:0 | A100-40GB | 780 MiB / 40.0 GiB (1.9%) | 768 MiB |" in md
    assert "| 2: cuda:0, cuda:1 | 4.00 ms | 1.45x | OPTIMAL (the plan) |" in md
    # Every table row has as many cells as its header.
    for block in md.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.startswith("|")]
        if lines:
            cells = {ln.replace("\\|", "").count("|") for ln in lines}
            assert len(cells) == 1, block


def test_write_report_writes_three_files_or_none(tmp_path, monkeypatch) -> None:
    plan = make_plan()
    written = write_report(tmp_path, as_plan(plan))
    assert sorted(p.name for p in written) == ["report.html", "summary.md", "summary.txt"]
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert "4.00 ms" in before["summary.txt"].decode()

    def broken(*args):
        raise RuntimeError("template bug")

    monkeypatch.setattr(page_module, "render_markdown", broken)
    plan["model"] = "Changed"
    with pytest.raises(RuntimeError, match="template bug"):
        write_report(tmp_path, as_plan(plan))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing half-new
    assert all(oct(os.stat(p).st_mode)[-3:] != "600" for p in tmp_path.iterdir())


@pytest.mark.parametrize("exc", [OSError, KeyboardInterrupt])
def test_a_failure_while_replacing_the_files_puts_the_old_ones_back(tmp_path, monkeypatch,
                                                                    exc) -> None:
    # `autoplace report` rewrites the three files of an existing output directory: a failure
    # after the first is replaced (a full disk, Ctrl-C) must not leave a mix of old and new.
    from autoplace.formats import output

    write_report(tmp_path, as_plan(make_plan()))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real_replace = output.os.replace
    calls = []

    def replace_then_fail(src, dst):
        calls.append(dst)
        if len(calls) == 4:  # old report.html out, new one in, old summary.md out, then this
            raise exc("injected")
        real_replace(src, dst)

    monkeypatch.setattr(output.os, "replace", replace_then_fail)
    plan = make_plan()
    plan["model"] = "Changed"
    with pytest.raises(exc, match="injected"):
        write_report(tmp_path, as_plan(plan))
    monkeypatch.setattr(output.os, "replace", real_replace)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    # Without the failure the same call replaces all three.
    write_report(tmp_path, as_plan(plan))
    assert all("Changed" in (tmp_path / name).read_text() for name in before)


def test_plan_json_round_trip_keeps_whatif(tmp_path) -> None:
    from autoplace.formats.plan import Plan

    plan = make_plan()
    plan["outputs"] = ["head"]
    plan["whatif"] = [{"devices": ["cuda:0"], "makespan_s": None, "status": "INFEASIBLE",
                       "detail": "does not fit"}]
    again = Plan.from_dict(json.loads(json.dumps(plan))).to_dict()
    assert again["whatif"] == plan["whatif"]
    del plan["whatif"]
    assert "whatif" not in Plan.from_dict(plan).to_dict()
