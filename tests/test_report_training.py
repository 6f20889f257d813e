"""The report of a training plan: the memory of a step split into its parts (``train.breakdown``)
and the training section of the page and summaries, with the schedule drawn as blocks of one
phase and micro-batch per device.

The plans come from ``zoo.mlp_training_plan``: Adam on two A100s with 5.5 MB each beside the
runtime's reserve, so the step is split, and SGD unconstrained. The micro-batch plans are the
MLP's step of several micro-batches split by hand, and one built by hand to the byte, as
``tests/test_report.py``'s is.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest
import zoo
from test_report import as_plan, assert_parts_have_distinct_colors, make_plan

from autoplace.formats.plan import Plan, SolverRecord, read_plan
from autoplace.pipeline import save
from autoplace.report import (
    format_bytes,
    format_seconds,
    render_html,
    render_markdown,
    summary_text,
)
from autoplace.report.analysis import schedule_blocks
from autoplace.simulate.schedules import phase_of
from autoplace.train.breakdown import BREAKDOWN_PARTS, memory_breakdown

MIB = 2**20
PARAMS = 940_584  # zoo.MLP's parameters, all trained


@pytest.fixture(scope="module")
def adam() -> Plan:
    return zoo.mlp_training_plan("adam", device_bytes=5_500_000)


@pytest.fixture(scope="module")
def sgd() -> Plan:
    return zoo.mlp_training_plan("sgd")


def test_traced_node_names_hold_no_suffix_character(adam: Plan) -> None:
    # torch.export and torch.fx name nodes as Python identifiers, so a traced step graph's
    # names parse without ambiguity (``tests/test_schedules.py`` tests the parser).
    forward = [phase_of(n.name)[0] for n in adam.problem.graph.nodes]
    assert all(name.isidentifier() for name in forward), forward


def test_the_parts_add_up_to_the_peak_on_each_device(adam: Plan, tmp_path) -> None:
    schedule = adam.schedule
    assert len(set(schedule.placement.device_of.values())) == 2  # the step is split
    parts = memory_breakdown(adam.problem, schedule)
    for device in adam.problem.cluster.devices:
        row = parts[device.name]
        assert list(row) == list(BREAKDOWN_PARTS)
        assert sum(row.values()) == schedule.peak_bytes[device.name]
        assert row["reserved_bytes"] == device.reserved_bytes > 0
        assert min(row.values()) >= 0 and row["activation_bytes"] > 0
    assert sum(row["parameter_bytes"] for row in parts.values()) == PARAMS
    # plan.json keeps what the split needs (each node's trainable bytes): a report rendered
    # from the file says the same.
    save(adam, tmp_path)
    again = read_plan(tmp_path)
    assert memory_breakdown(again.problem, again.schedule) == parts


def test_optimizer_state_is_none_under_sgd_and_twice_the_gradients_under_adam(
        adam: Plan, sgd: Plan) -> None:
    for plan, state in ((sgd, 0), (adam, 2)):
        parts = memory_breakdown(plan.problem, plan.schedule).values()
        assert sum(row["gradient_bytes"] for row in parts) == PARAMS
        for row in parts:
            assert row["optimizer_state_bytes"] == state * row["gradient_bytes"]
            assert row["gradient_bytes"] == row["parameter_bytes"]  # no buffer, none frozen


def _figure(html: str, chart: str) -> dict[str, Any]:
    block = re.search(rf'<script type="application/json" data-chart="{chart}">(.*?)</script>',
                      html, re.S)
    assert block, chart
    return json.loads(block.group(1))


def test_a_training_report_has_the_step_section_and_draws_the_schedule(adam: Plan) -> None:
    html = render_html(adam)
    assert 'id="training-section"' in html and "makespan of one training step" in html
    section = html[html.index('id="training-section"'):html.index('id="timeline-section"')]
    assert "<b>Optimizer:</b> adam" in section and "<b>Micro-batches (M):</b> 1" in section
    assert "<b>Schedule:</b> gpipe" in section and "replicas (R):</b> 1" in section
    parts = memory_breakdown(adam.problem, adam.schedule)
    for device, row in parts.items():
        assert re.search(rf"{re.escape(device)}</td>\s*<td class=\"n\">"
                         rf"{re.escape(format_bytes(row['parameter_bytes']))}</td>", section)
    # The timeline: a trace per phase, each device a forward and a backward block at least.
    timeline = _figure(html, "timeline")
    bars = {t["name"]: t for t in timeline["data"] if t["type"] == "bar"}
    assert set(bars) == {"forward", "backward", "optimizer step"}
    lanes = range(len(adam.problem.cluster.names))
    for phase in ("forward", "backward"):
        assert set(bars[phase]["y"]) == set(lanes), phase
    blocks = schedule_blocks(adam)
    assert sum(len(t["y"]) for t in bars.values()) == len(blocks) < len(adam.problem.graph.nodes)
    # The peak chart stacks gradients and optimizer state between parameters and activations.
    peak = [t["name"] for t in _figure(html, "memory-peak")["data"]]
    assert peak == ["runtime reserve", "parameters", "gradients", "optimizer state",
                    "activations at peak", "free"]
    assert_parts_have_distinct_colors(_figure(html, "memory-peak"))

    markdown = render_markdown(adam)
    assert ("**Training step**: adam, 1 micro-batch (gpipe), 1 replica, layers in train(); "
            "training check skipped") in markdown
    assert "| device | parameters | gradients | optimizer state | activations |" in markdown
    text = summary_text(adam)
    assert "training step: adam, 1 micro-batch (gpipe), 1 replica" in text
    # seven columns: two-word headers take two lines, so that the table fits 80 columns
    assert re.search(r"^ +optimizer +runtime *$", text, re.M)
    assert re.search(r"^ device +parameters +gradients +state +activations +reserve +peak", text,
                     re.M)


def test_an_inference_report_has_no_training_section() -> None:
    plan = as_plan(make_plan())
    html = render_html(plan)
    assert "training-section" not in html and "makespan of one forward pass" in html
    bars = [t for t in _figure(html, "timeline")["data"] if t["type"] == "bar"]
    assert [t["name"] for t in bars] == ["cuda:0", "cuda:1"]  # a bar per node, by device
    assert sum(len(t["y"]) for t in bars) == len(plan.problem.graph.nodes)
    assert "gradients" not in [t["name"] for t in _figure(html, "memory-peak")["data"]]
    assert "Training step" not in render_markdown(plan)
    assert "training step" not in summary_text(plan)


def _microbatch_plan() -> dict[str, Any]:
    """Two layers, ``l`` (two nodes, ``l`` and ``r``) on cuda:0 and ``m`` on cuda:1, two
    micro-batches in GPipe order (ms):

        cuda:0  l#0 0-0.5, r#0 0.52-1 | l#1 1-1.5, r#1 1.5-2 | ...
                l@backward#0 5.2-7.2 | l@backward#1 7.2-9.2 | l@step 9.2-9.6
        cuda:1  m#0 1.1-2.1 | m#1 2.1-3.1 | m@backward#0 3.1-5.1 | m@backward#1 5.1-7.1
                | m@step 7.1-7.5

    ``l#0`` holds l's 4 MiB of parameters (trained), ``l@step`` its gradients and Adam's two
    moments (12 MiB); ``m#0`` and ``m@step`` likewise with 1 MiB."""
    data = make_plan()
    spans = {"cuda:0": [("l#0", 0.0, 0.5), ("r#0", 0.52, 1.0), ("l#1", 1.0, 1.5),
                        ("r#1", 1.5, 2.0), ("l@backward#0", 5.2, 7.2),
                        ("l@backward#1", 7.2, 9.2), ("l@step", 9.2, 9.6)],
             "cuda:1": [("m#0", 1.1, 2.1), ("m#1", 2.1, 3.1), ("m@backward#0", 3.1, 5.1),
                        ("m@backward#1", 5.1, 7.1), ("m@step", 7.1, 7.5)]}
    held = {"l#0": (4, 4), "l@step": (12, 0), "m#0": (1, 1), "m@step": (3, 0)}
    nodes = []
    for device, lane in spans.items():
        for name, start, end in lane:
            memory, trainable = held.get(name, (0, 0))
            nodes.append({"name": name, "ops": [name], "module": name[0], "device": device,
                          "start_s": start * 1e-3, "end_s": end * 1e-3,
                          "compute_s": {"cuda:0": (end - start) * 1e-3,
                                        "cuda:1": (end - start) * 1e-3},
                          "memory_bytes": memory * MIB, "trainable_bytes": trainable * MIB,
                          "output_bytes": MIB, "cost_source": "analytic"})
    data.update(nodes=nodes, edges=[], transfers=[], makespan_s=9.6e-3, lower_bound_s=9.0e-3,
                training={"optimizer": "adam", "microbatches": 2, "schedule": "gpipe",
                          "check": {"status": "skipped"}})
    data["memory"]["cuda:0"].update(resident_bytes=16 * MIB, peak_bytes=20 * MIB)
    data["memory"]["cuda:1"].update(resident_bytes=4 * MIB, peak_bytes=6 * MIB)
    return data


def test_micro_batches_draw_as_one_block_per_phase_and_micro_batch() -> None:
    plan = as_plan(_microbatch_plan())
    # r#0 starts 20 µs after l#0 ends: a block of its own, unless the gap is not to be drawn.
    assert [b.nodes for b in schedule_blocks(plan)][:2] == [("l#0",), ("r#0",)]
    blocks = [(b.device, b.phase, b.microbatch, b.nodes)
              for b in schedule_blocks(plan, merge_gap_s=30e-6)]
    assert blocks == [
        ("cuda:0", "forward", 0, ("l#0", "r#0")), ("cuda:0", "forward", 1, ("l#1", "r#1")),
        ("cuda:0", "backward", 0, ("l@backward#0",)),
        ("cuda:0", "backward", 1, ("l@backward#1",)), ("cuda:0", "step", None, ("l@step",)),
        ("cuda:1", "forward", 0, ("m#0",)), ("cuda:1", "forward", 1, ("m#1",)),
        ("cuda:1", "backward", 0, ("m@backward#0",)),
        ("cuda:1", "backward", 1, ("m@backward#1",)), ("cuda:1", "step", None, ("m@step",)),
    ]
    html = render_html(plan)  # hides gaps under 0.3% of the span: 29 µs here
    bars = {t["name"]: t for t in _figure(html, "timeline")["data"] if t["type"] == "bar"}
    assert bars["forward"]["text"] == ["F0", "F1", "F0", "F1"]
    assert bars["backward"]["text"] == ["B0", "B1", "B0", "B1"]
    assert bars["optimizer step"]["text"] == ["step", "step"]
    assert "<b>Micro-batches (M):</b> 2" in html and "replicas (R):</b> 1" in html
    # Gradients are the trained bytes of the layer's forward node, wherever its micro-batch
    # copies are; the step's other bytes are Adam's moments.
    parts = memory_breakdown(plan.problem, plan.schedule)
    assert parts["cuda:0"] == {
        "reserved_bytes": 0, "parameter_bytes": 4 * MIB, "gradient_bytes": 4 * MIB,
        "optimizer_state_bytes": 8 * MIB, "activation_bytes": 4 * MIB}
    assert parts["cuda:1"]["optimizer_state_bytes"] == 2 * MIB


def _split_microbatch_plan(microbatches: int, schedule: str) -> Plan:
    """``zoo.MLP``'s Adam step of ``microbatches`` micro-batches of 16 on two A100s, fc1's
    layer (the first four forward nodes: the inputs, the guard and fc1) on cuda:0 and the rest
    on cuda:1, simulated in ``schedule``'s order."""
    import torch
    import torch.nn.functional as F

    from autoplace.cluster import resolve_cluster
    from autoplace.fold import fold
    from autoplace.formats.plan import SolverRecord
    from autoplace.formats.records import TrainingRecord
    from autoplace.ir import Placement, Problem
    from autoplace.profile.cost import costs
    from autoplace.simulate import simulate
    from autoplace.trace import trace_model
    from autoplace.train import LossModel, step_problem

    torch.manual_seed(0)
    traced = trace_model(LossModel(zoo.MLP(), F.cross_entropy), (torch.randn(16, 784),),
                         {"targets": (torch.randint(0, 10, (16,)),)})
    cluster, _ = resolve_cluster(spec="2xA100-40GB")
    folded = fold(traced.graph, costs(traced.graph, cluster))
    step = step_problem(Problem(graph=folded.graph, cluster=cluster, costs=folded.costs),
                        "adam", microbatches=microbatches, schedule=schedule)
    head = [phase_of(n.name)[0] for n in step.graph.nodes if n.name.endswith("#0")][:4]
    device_of = {n.name: "cuda:0" if phase_of(n.name)[0] in head else "cuda:1"
                 for n in step.graph.nodes}
    return Plan(problem=step, schedule=simulate(step, Placement(device_of=device_of)),
                lower_bound_s=0.0, solver=SolverRecord(name="test", status="FEASIBLE",
                                                       wall_s=0.0),
                baselines={}, best_single_device=None,
                training=TrainingRecord(optimizer="adam", microbatches=microbatches,
                                        schedule=schedule))


@pytest.mark.parametrize("microbatches, schedule", [(2, "gpipe"), (4, "1f1b")])
def test_a_step_of_micro_batches_adds_up_and_draws_each_one(microbatches: int,
                                                            schedule: str) -> None:
    plan = _split_microbatch_plan(microbatches, schedule)
    parts = memory_breakdown(plan.problem, plan.schedule)
    for device, row in parts.items():
        assert sum(row.values()) == plan.schedule.peak_bytes[device] and min(row.values()) >= 0
        assert row["optimizer_state_bytes"] == 2 * row["gradient_bytes"] > 0
    assert sum(row["gradient_bytes"] for row in parts.values()) == PARAMS
    # Every device runs a forward and a backward block of every micro-batch, in the
    # schedule's order (blocks split only by idle gaps), its updates last.
    for device in plan.problem.cluster.names:
        runs: list[tuple[str, int | None]] = []
        for b in schedule_blocks(plan):
            if b.device == device and (not runs or runs[-1] != (b.phase, b.microbatch)):
                runs.append((b.phase, b.microbatch))
        every = {(p, k) for p in ("forward", "backward") for k in range(microbatches)}
        assert set(runs) == every | {("step", None)} and runs[-1] == ("step", None)
        if schedule == "gpipe":
            assert runs[:-1] == sorted(every, key=lambda r: (r[0] == "backward", r[1]))
    html = render_html(plan)
    bars = {t["name"]: t for t in _figure(html, "timeline")["data"] if t["type"] == "bar"}
    labels = {label for t in bars.values() for label in t["text"]}
    assert labels <= {f"{p}{k}" for p in "FB" for k in range(microbatches)} | {"step", ""}
    assert f"<b>Micro-batches (M):</b> {microbatches}" in html


def test_solver_progress_of_a_step_of_micro_batches_says_what_its_model_leaves_free() -> None:
    # The step's graph on two A100s: CP-SAT's model bounds the launcher and leaves the
    # micro-batches' order free; the simulator schedules both (GPipe's order on each device),
    # so a plan 25% above CP-SAT's objective names both.
    plan = _split_microbatch_plan(2, "gpipe")
    nodes = len(plan.problem.graph.nodes)
    objective_s = plan.makespan_s / 1.25
    plan = replace(plan, solver=SolverRecord(
        name="cpsat", status="FEASIBLE", wall_s=1.0, objective_s=objective_s,
        progress=((0.5, objective_s, objective_s / 2),),
        scope={"graph": "folded", "nodes": nodes, "folded_nodes": nodes}))
    title = _figure(render_html(plan), "progress")["layout"]["title"]
    assert title["text"] == (
        f"CP-SAT's objective: the makespan of its model of the training step's graph ({nodes} "
        "nodes),<br>which bounds the launcher's segment calls and handovers but does not "
        "schedule them<br>and leaves the micro-batches' order free")
    makespan_s = plan.makespan_s
    assert title["subtitle"]["text"] == (
        f"The plan's simulated makespan, {format_seconds(makespan_s)}, is "
        f"{format_seconds(makespan_s - objective_s)} (25%) above CP-SAT's last objective, "
        f"{format_seconds(objective_s)}:<br>the simulator schedules the launcher's segment calls "
        "and handovers on its host thread<br>and runs each device's micro-batches in gpipe order")
